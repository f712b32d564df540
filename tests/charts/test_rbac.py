"""The chart's RBAC grants what the code asks the API for, and nothing more.

The webhook's code (webhook/kube.py) is run against the fake API server, which records every
request as (API group, resource, verb); the chart's ClusterRole must grant exactly that set.
The reconciler's ClusterRole must grant list and watch of every kind reconciler/kube.py
watches (checked once that module exists).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from tests.charts.conftest import of_kind
from tests.support.fakeapi import FakeApiServer, ResourceType
from tests.support.objects import gateway_class

Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def granted(role: dict[str, Any]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def role_named(manifests: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (role,) = [r for r in of_kind(manifests, kind) if r["metadata"]["name"].endswith(suffix)]
    return role


class RecordingApiServer(FakeApiServer):
    """The fake API server, keeping (group, resource, verb) of every request it serves."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[Grant] = set()

    def _note(self, rt: ResourceType, verb: str, sub: str | None = None) -> None:
        self.asked.add((rt.group, f"{rt.plural}/{sub}" if sub else rt.plural, verb))

    def get(self, rt: ResourceType, ns: str, name: str) -> Any:
        self._note(rt, "get")
        return super().get(rt, ns, name)

    def list(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> Any:
        self._note(rt, "list")
        return super().list(rt, ns, query)

    def watch_events(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> Any:
        self._note(rt, "watch")
        return super().watch_events(rt, ns, query)

    def create(self, rt: ResourceType, ns: str, body: Any, dry_run: bool = False) -> Any:
        self._note(rt, "create")
        return super().create(rt, ns, body, dry_run)

    def replace(self, rt: ResourceType, ns: str, name: str, body: Any, sub: Any, dry: Any) -> Any:
        self._note(rt, "update", sub)
        return super().replace(rt, ns, name, body, sub, dry)

    def patch(
        self, rt: ResourceType, ns: str, name: str, ctype: str, body: Any, sub: Any, dry: Any
    ) -> Any:
        self._note(rt, "patch", sub)
        return super().patch(rt, ns, name, ctype, body, sub, dry)

    def delete(self, rt: ResourceType, ns: str, name: str, dry_run: bool = False) -> Any:
        self._note(rt, "delete")
        return super().delete(rt, ns, name, dry_run)

    def review_access(self, review: Any) -> Any:
        self.asked.add(("authorization.k8s.io", "subjectaccessreviews", "create"))
        return super().review_access(review)


@pytest.fixture
def api() -> Iterator[RecordingApiServer]:
    with RecordingApiServer() as server:
        yield server


def test_webhook_role_grants_exactly_what_its_code_asks(
    api: RecordingApiServer, default_manifests: list[dict[str, Any]]
) -> None:
    from webhook.kube import KubeLookup, discover_cluster_networks

    api.seed(gateway_class("stunner-gatewayclass"))
    api.asked.clear()  # seeding is the test's doing, not the webhook's
    client = api.api_client()
    lookup = KubeLookup(client).for_user({"username": "alice", "groups": ["dev"]})
    # Every question the rule table can ask (stunner_api.rules.Lookup), then start-up discovery.
    assert lookup.gateway_class("stunner-gatewayclass") is not None
    assert lookup.secret("stunner", "absent") is None
    assert lookup.reference_grants("stunner") == []
    assert lookup.may_read_secret("other", "turn-tls") is False
    networks = discover_cluster_networks(client)
    assert networks.problems == ()
    lookup_methods = {"secret", "gateway_class", "reference_grants", "may_read_secret"}
    asked_by_rules = {m for m in dir(KubeLookup) if not m.startswith("_")} - {"close", "for_user"}
    assert asked_by_rules == lookup_methods, "a new Lookup question: exercise it here"

    role = role_named(default_manifests, "ClusterRole", "webhook")
    assert granted(role) == api.asked


def test_reconciler_role_grants_list_and_watch_of_every_watched_kind(
    default_manifests: list[dict[str, Any]],
) -> None:
    if importlib.util.find_spec("reconciler.kube") is None:
        pytest.skip("reconciler/kube.py (cluster mode, issue 12) is not merged yet")
    from reconciler import kube  # type: ignore[attr-defined]

    grants = granted(role_named(default_manifests, "ClusterRole", "reconciler"))
    for watched in kube.WATCHED:
        for verb in ("list", "watch"):
            assert (watched.info.group, watched.info.plural, verb) in grants, watched.name


def test_reconciler_leader_election_is_namespaced(default_manifests: list[dict[str, Any]]) -> None:
    role = role_named(default_manifests, "Role", "reconciler")
    assert granted(role) == {
        ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")
    }
    cluster = granted(role_named(default_manifests, "ClusterRole", "reconciler"))
    assert not [g for g in cluster if g[1] in ("leases", "*") or g[2] == "*"]
