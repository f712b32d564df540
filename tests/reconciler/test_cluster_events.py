"""Kubernetes Events (events.k8s.io/v1) the reconciler records, against the fake API server:
a Gateway becoming valid or invalid, its Deployment and Service created and deleted, a write
refused again and again; none in a steady state; none with a secret; recording turned off when
the API server does not serve Events. And the pure parts (reconciler.events)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from reconciler.apply import Verb, Write
from reconciler.events import (
    DEDUPE_WINDOW,
    FAILED_WRITE_EVENT_AFTER,
    EventSpec,
    Recorder,
    Reference,
    for_failure,
    for_success,
    validity,
)
from reconciler.kube.api import refusal
from tests.reconciler import clusterkit as k
from tests.support.fakeapi import FakeApiServer

GW = k.GW
PASSWORD = "pass-word"  # clusterkit's GatewayConfig password


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(type, reason, regarding kind/name, related kind or "")."""
    return [
        (
            e["type"],
            e["reason"],
            f"{e['regarding']['kind']}/{e['regarding']['name']}",
            (e.get("related") or {}).get("kind", ""),
        )
        for e in events
    ]


def test_events_follow_what_the_reconciler_did_and_a_steady_state_records_none(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        with k.with_events() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                await k.eventually(lambda: len(k.recorded_events(fake)) == 4)
                first = k.recorded_events(fake)
                assert sorted(summary(first)) == [
                    ("Normal", "Created", "Gateway/gw", "Deployment"),
                    ("Normal", "Created", "Gateway/gw", "Service"),
                    ("Normal", "Created", "Gateway/gw", "ServiceAccount"),
                    ("Normal", "Valid", "Gateway/gw", ""),
                ]
                gateway = k.get(fake, GW, "Gateway", "gw")
                assert gateway is not None
                for event in first:
                    assert event["metadata"]["namespace"] == k.NS
                    assert event["regarding"]["uid"] == gateway["metadata"]["uid"]
                    assert event["reportingController"] == k.CONTROLLER
                    assert event["reportingInstance"] and event["eventTime"]
                # A second pass over the unchanged cluster: no write at all, no Event either.
                writes = fake.writes()
                renders = running.mode.reconciler.renders
                running.mode.reconciler.trigger()
                await running.rendered(renders + 1)
                await k.settled(running, fake)
                assert fake.writes() == writes
                # The Gateway becomes invalid: it says why; its objects are deleted.
                k.delete(fake, "stunner.l7mp.io/v1", "GatewayConfig", "config")
                await k.eventually(lambda: len(k.recorded_events(fake)) == 8)
                invalid = k.recorded_events(fake)[4:]
                assert sorted(summary(invalid)) == [
                    ("Normal", "Deleted", "Gateway/gw", "Deployment"),
                    ("Normal", "Deleted", "Gateway/gw", "Service"),
                    ("Normal", "Deleted", "Gateway/gw", "ServiceAccount"),
                    ("Warning", "Invalid", "Gateway/gw", ""),
                ]
                (why,) = [e["note"] for e in invalid if e["reason"] == "Invalid"]
                assert "No GatewayConfig found" in why
                # Fixed: valid again, told as it happens (a change back is no repeat).
                fake.seed(k.gateway_config())
                await k.eventually(lambda: len(k.recorded_events(fake)) == 12)
                assert sorted(summary(k.recorded_events(fake)[8:])) == sorted(summary(first))
                await k.settled(running, fake)
                assert running.mode.recorder.dropped == 0
                # Someone deletes the Deployment: re-created, told once; again: not told again.
                for _ in range(2):
                    k.delete(fake, "apps/v1", "Deployment", "gw")
                    await k.eventually(lambda: k.get(fake, "apps/v1", "Deployment", "gw"))
                    await k.settled(running, fake)
                assert running.mode.recorder.dropped == 2
                assert len(k.recorded_events(fake)) == 12
            notes = [str(e) for e in k.recorded_events(fake)]
            assert not [n for n in notes if PASSWORD in n]

    asyncio.run(main())


def test_a_write_refused_again_and_again_is_one_warning(tmp_path: Path) -> None:
    async def main() -> None:
        with k.with_events() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                fake.refuse("PUT", "deployments", 422)
                k.scale_dataplane(fake, 2)
                puts = lambda: [  # noqa: E731
                    p for m, p in fake.writes() if m == "PUT" and "/deployments/" in p
                ]
                await k.eventually(lambda: len(puts()) >= FAILED_WRITE_EVENT_AFTER + 1)
                failed = [e for e in k.recorded_events(fake) if e["reason"] == "WriteFailed"]
                (event,) = failed
                assert event["type"] == "Warning" and event["action"] == "Update"
                assert event["regarding"]["kind"] == "Gateway"
                assert "422" in event["note"] and "refused (fake" not in event["note"]
                fake.refuse("PUT", "deployments", None)
                await k.eventually(lambda: _replicas(fake) == 2, what="the update through")

    asyncio.run(main())


def _replicas(fake: FakeApiServer) -> Any:
    deployment = k.get(fake, "apps/v1", "Deployment", "gw") or {}
    return deployment.get("spec", {}).get("replicas")


def test_an_api_server_without_events_is_asked_once(tmp_path: Path) -> None:
    async def main() -> None:
        with FakeApiServer() as fake:  # serves no events.k8s.io
            k.world(fake, k.gateway(name="other"))
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                assert running.mode.recorder.enabled is False
                assert k.get(fake, "apps/v1", "Deployment", "other") is not None
            tries = [p for m, p in fake.writes() if "/events" in p]
            assert len(tries) == 1

    asyncio.run(main())


# --- the pure parts -----------------------------------------------------------------------------


def status(accepted: str, programmed_reason: str = "Programmed") -> dict[str, Any]:
    return {
        "conditions": [
            {"type": "Accepted", "status": accepted, "reason": "R", "message": "m"},
            {"type": "Programmed", "status": "x", "reason": programmed_reason, "message": "p"},
        ]
    }


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, None),
        ({}, None),
        (status("True"), True),
        (status("True", "AddressNotAssigned"), True),
        (status("True", "Invalid"), False),
        (status("False"), False),
    ],
)
def test_validity(given: Mapping[str, Any] | None, expected: bool | None) -> None:
    verdict = validity(given)
    assert (verdict[0] if verdict else None) == expected


def _gateway_status(body: Mapping[str, Any]) -> Write:
    return Write(Verb.STATUS, GW, "Gateway", k.NS, "gw", body)


def test_only_a_flip_of_validity_is_an_event() -> None:
    valid, invalid = status("True"), status("False")
    before = {"metadata": {"uid": "u"}, "status": valid}
    assert for_success(_gateway_status(valid), before) == []
    assert for_success(_gateway_status(status("True", "AddressNotAssigned")), before) == []
    (flip,) = for_success(_gateway_status(invalid), before)
    assert (flip.type, flip.reason, flip.regarding.uid) == ("Warning", "Invalid", "u")
    (first,) = for_success(_gateway_status(valid), {"metadata": {"uid": "u"}})
    assert first.reason == "Valid"
    # Status writes of other kinds and updates are no event.
    update = Write(Verb.UPDATE, "apps/v1", "Deployment", k.NS, "gw", {})
    assert for_success(update, None) == []


def test_a_failed_write_is_an_event_once_and_without_the_servers_message() -> None:
    write = Write(Verb.UPDATE, "v1", "Service", k.NS, "gw", {"metadata": {}})
    error = "422 Unprocessable Entity: spec.ports[0]: value 'secret-ish' is invalid"
    counts = [len(for_failure(write, None, n, error)) for n in range(1, 8)]
    assert counts == [1 if n == FAILED_WRITE_EVENT_AFTER else 0 for n in range(1, 8)]
    (event,) = for_failure(write, None, FAILED_WRITE_EVENT_AFTER, error)
    assert "422 Unprocessable Entity" in event.note and "secret-ish" not in event.note


class Posts:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.bodies: list[Mapping[str, Any]] = []
        self.fail = fail

    def create_event(self, body: Mapping[str, Any]) -> None:
        self.bodies.append(body)
        if self.fail is not None:
            raise self.fail


def _spec(note: str = "n") -> EventSpec:
    return EventSpec("Normal", "Valid", "Render", note, Reference(GW, "Gateway", k.NS, "gw", "u"))


def test_the_recorder_drops_a_repeat_of_the_last_event_within_the_window() -> None:
    now = [0.0]
    posts = Posts()
    recorder = Recorder(posts, k.CONTROLLER, "me", refusal, clock=lambda: now[0])
    recorder.record([_spec(), _spec(), _spec("other"), _spec()])
    assert len(posts.bodies) == 3 and recorder.dropped == 1  # a change back is recorded
    recorder.record([_spec()])
    assert recorder.dropped == 2
    now[0] = DEDUPE_WINDOW + 1
    recorder.record([_spec()])
    assert len(posts.bodies) == 4
    body = posts.bodies[0]
    assert body["apiVersion"] == "events.k8s.io/v1" and body["reportingInstance"] == "me"
    assert body["metadata"]["name"].startswith("gw.")


def test_a_cluster_scoped_object_s_events_go_to_default() -> None:
    posts = Posts()
    recorder = Recorder(posts, k.CONTROLLER, "me", refusal)
    spec = EventSpec(
        "Warning", "WriteFailed", "Status", "n", Reference(GW, "GatewayClass", "", "c")
    )
    recorder.record([spec])
    assert posts.bodies[0]["metadata"]["namespace"] == "default"
    assert "namespace" not in posts.bodies[0]["regarding"]


def test_the_recorder_keeps_trying_after_a_passing_failure() -> None:
    posts = Posts(fail=TimeoutError("slow"))
    recorder = Recorder(posts, k.CONTROLLER, "me", refusal)
    recorder.record([_spec("a"), _spec("b")])
    assert recorder.enabled and len(posts.bodies) == 2 and recorder.recorded == 0
