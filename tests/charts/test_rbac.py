"""The chart's RBAC grants what the code asks the API for, and nothing more.

The webhook's code (webhook/kube.py) is run against the fake API server, which records every
request as (API group, resource, verb); the chart's ClusterRole must grant exactly that set.
The same for the reconciler in cluster mode (reconciler/kube/), driven through every kind of
request it makes.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from tests.charts.conftest import of_kind
from tests.support.fakeapi import (
    CORE_TYPES,
    GATEWAY_TYPES,
    SUBJECT_ACCESS_REVIEWS,
    TCP_ROUTE_TYPES,
    TOKEN_REVIEWS,
    FakeApiServer,
    ResourceType,
)
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
    """The fake API server, telling (group, resource, verb) of every HTTP request it served (what
    the test itself seeds or edits directly is not a request)."""

    VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}

    def __init__(self) -> None:
        from tests.reconciler.clusterkit import EVENT_TYPE

        # And Events, recorded; and Gateway API's TCPRoute (its CRD is not the chart's).
        super().__init__((*CORE_TYPES, *GATEWAY_TYPES, *TCP_ROUTE_TYPES, EVENT_TYPE))
        self.watched: set[Grant] = set()

    def watch_events(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> Any:
        self.watched.add((rt.group, rt.plural, "watch"))  # only the HTTP handler watches
        return super().watch_events(rt, ns, query)

    @property
    def asked(self) -> set[Grant]:
        out = set(self.watched)
        for method, path in list(self.requests):
            if path == SUBJECT_ACCESS_REVIEWS:
                out.add(("authorization.k8s.io", "subjectaccessreviews", "create"))
                continue
            if path == TOKEN_REVIEWS:
                out.add(("authentication.k8s.io", "tokenreviews", "create"))
                continue
            routed = self.route(path)
            if isinstance(routed, dict):
                continue  # discovery
            rt, _, name, sub = routed
            verb = self.VERBS.get(method) or ("get" if name else "list")
            out.add((rt.group, f"{rt.plural}/{sub}" if sub else rt.plural, verb))
        return out


@pytest.fixture
def api() -> Iterator[RecordingApiServer]:
    with RecordingApiServer() as server:
        yield server


def test_webhook_role_grants_exactly_what_its_code_asks(
    api: RecordingApiServer, default_manifests: list[dict[str, Any]]
) -> None:
    from webhook.kube import KubeLookup, discover_cluster_networks

    api.seed(gateway_class("stunner-gatewayclass"))
    client = api.api_client()
    lookup = KubeLookup(client).for_user({"username": "alice", "groups": ["dev"]})
    # Every question the rule table can ask (stunner_api.rules.Lookup), then start-up discovery.
    assert lookup.gateway_class("stunner-gatewayclass") is not None
    assert lookup.gateway("stunner", "absent") is None
    assert lookup.secret("stunner", "absent") is None
    assert lookup.reference_grants("stunner") == []
    assert lookup.may_read_secret("other", "turn-tls") is False
    assert lookup.gateways() == []
    assert lookup.gateway_config("stunner", "absent") is None
    assert lookup.dataplane("absent") is None
    networks = discover_cluster_networks(client)
    assert networks.problems == ()
    lookup_methods = {
        "secret",
        "gateway_class",
        "gateway",
        "reference_grants",
        "may_read_secret",
        "gateways",
        "gateway_config",
        "dataplane",
    }
    asked_by_rules = {m for m in dir(KubeLookup) if not m.startswith("_")} - {"close", "for_user"}
    assert asked_by_rules == lookup_methods, "a new Lookup question: exercise it here"

    role = role_named(default_manifests, "ClusterRole", "webhook")
    assert granted(role) == api.asked


def test_reconciler_roles_grant_exactly_what_cluster_mode_asks(
    api: RecordingApiServer, default_manifests: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Cluster mode through every kind of request it makes: the first pass (creates, status),
    a Dataplane edit (an update), a conflict (a re-read), a switch to a DaemonSet (created, the
    Deployment deleted) and an edit of it, a Gateway API UDPRoute's and TCPRoute's status, an
    edit of the Gateway's ServiceAccount (written back), the disable-managed-dataplane annotation
    (the DaemonSet deleted), an invalid Gateway (its Service and ServiceAccount deleted), the Events
    these record, and the Lease."""
    from tests.reconciler import clusterkit as k

    gw_route = k.route(name="gw-route") | {"apiVersion": "gateway.networking.k8s.io/v1"}
    gw_route["spec"]["rules"] = [{"backendRefs": [{"name": "media", "port": 9000}]}]
    tcp_route = gw_route | {
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TCPRoute",
        "metadata": {"name": "tcp-route", "namespace": k.NS},
    }
    lease = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.2}

    async def scenario() -> None:
        k.world(api, gw_route, tcp_route)
        async with k.reconciler(api, tmp_path, leader_elect=True, identity="a", **lease) as r:
            tcp_status = ("gateway.networking.k8s.io", "tcproutes/status", "patch")
            await k.eventually(lambda: _asked(api, tcp_status))
            # Leading and at rest (settled waits for both): otherwise the first pass would
            # write the edited Dataplane's Deployment.
            await k.settled(r, api)
            api.refuse("PUT", "deployments", 409)
            k.update(api, "stunner.l7mp.io/v1", "Dataplane", "default", _more_replicas, ns="")
            await k.eventually(lambda: _asked(api, ("apps", "deployments", "get")))
            api.refuse("PUT", "deployments", None)
            await k.eventually(lambda: _asked(api, ("apps", "deployments", "update")))
            # One stunnerd per node: the DaemonSet is created and the Deployment deleted, then
            # a Dataplane edit updates the DaemonSet.
            k.update(api, "stunner.l7mp.io/v1", "Dataplane", "default", _daemonset, ns="")
            await k.eventually(lambda: _asked(api, ("apps", "daemonsets", "create")))
            await k.eventually(lambda: _asked(api, ("apps", "deployments", "delete")))
            k.update(api, "stunner.l7mp.io/v1", "Dataplane", "default", _pull_never, ns="")
            await k.eventually(lambda: _asked(api, ("apps", "daemonsets", "update")))
            k.update(api, GW, "Gateway", "gw", _second_listener)
            await k.eventually(lambda: _asked(api, ("", "services", "update")))
            k.update(api, "v1", "ServiceAccount", "gw-stunnerd", _mount_api_token)
            await k.eventually(lambda: _asked(api, ("", "serviceaccounts", "update")))
            k.update(api, GW, "Gateway", "gw", _unmanaged)
            await k.eventually(lambda: _asked(api, ("apps", "daemonsets", "delete")))
            k.delete(api, "stunner.l7mp.io/v1", "GatewayConfig", "config")
            await k.eventually(lambda: _asked(api, ("", "services", "delete")))
            await k.eventually(lambda: _asked(api, ("", "serviceaccounts", "delete")))
            await k.eventually(lambda: _asked(api, ("coordination.k8s.io", "leases", "update")))
            await k.eventually(lambda: _asked(api, ("events.k8s.io", "events", "create")))
            # A stunnerd's CDS request: its token is checked with a TokenReview.
            token = api.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,))
            url = f"{r.cds_address}/api/v1/configs/{k.NS}/gw"
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            try:
                answer = await asyncio.to_thread(urllib.request.urlopen, request, timeout=5)
            except urllib.error.HTTPError as error:  # 404: its Gateway is gone by now
                answer = error
            answer.close()
            assert _asked(api, ("authentication.k8s.io", "tokenreviews", "create"))

    asyncio.run(asyncio.wait_for(scenario(), 60))
    cluster = granted(role_named(default_manifests, "ClusterRole", "reconciler"))
    namespaced = granted(role_named(default_manifests, "Role", "reconciler"))
    # After a 409 the reconciler re-reads the object it wrote (reconciler.kube.api.Api.get, any
    # kind of kube.api.WRITTEN); the scenario provokes one such conflict, the table names the rest.
    from reconciler.kube.api import WRITTEN

    rereads = {(info.group, info.plural, "get") for info in WRITTEN.values()}
    assert ("apps", "deployments", "get") in api.asked
    assert cluster | namespaced == api.asked | rereads


GW = "gateway.networking.k8s.io/v1"


def _asked(api: RecordingApiServer, grant: Grant) -> bool:
    return grant in api.asked


def _more_replicas(dataplane: dict[str, Any]) -> None:
    dataplane["spec"]["replicas"] = 2


def _daemonset(dataplane: dict[str, Any]) -> None:
    dataplane["spec"]["dataplaneResource"] = "DaemonSet"


def _pull_never(dataplane: dict[str, Any]) -> None:
    dataplane["spec"]["imagePullPolicy"] = "Never"


def _second_listener(gateway: dict[str, Any]) -> None:
    gateway["spec"]["listeners"].append({"name": "udp2", "port": 3479, "protocol": "TURN-UDP"})


def _mount_api_token(account: dict[str, Any]) -> None:
    account["automountServiceAccountToken"] = True


def _unmanaged(gateway: dict[str, Any]) -> None:
    annotations = gateway["metadata"].setdefault("annotations", {})
    annotations["stunner.l7mp.io/disable-managed-dataplane"] = "true"


def test_reconciler_leader_election_is_namespaced(default_manifests: list[dict[str, Any]]) -> None:
    role = role_named(default_manifests, "Role", "reconciler")
    assert granted(role) == {
        ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")
    }
    cluster = granted(role_named(default_manifests, "ClusterRole", "reconciler"))
    assert not [g for g in cluster if g[1] in ("leases", "*") or g[2] == "*"]
