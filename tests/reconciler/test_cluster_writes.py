"""What every write of cluster mode carries: the field manager (managedFields credit
`stunner-reconciler`, not the client's user agent).

The fake API server logs (method, path) of each request, not its query; this test wraps the
fake's request handler to log the whole request line too (the fake itself is left as it is)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from reconciler.kube.api import FIELD_MANAGER
from tests.reconciler import clusterkit as k
from tests.support import fakeapi
from tests.support.fakeapi import FakeApiServer

Request = tuple[str, str, dict[str, list[str]]]  # (method, path, query)


@pytest.fixture
def request_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Request]]:
    """Every request the fake served, with its query."""
    seen: list[Request] = []
    dispatch = fakeapi._Handler._dispatch

    def recording(handler: fakeapi._Handler, method: str) -> None:
        url = urlsplit(handler.path)
        seen.append((method, url.path, parse_qs(url.query)))
        dispatch(handler, method)

    monkeypatch.setattr(fakeapi._Handler, "_dispatch", recording)
    yield seen


def test_every_write_names_the_field_manager(request_lines: list[Request], tmp_path: Path) -> None:
    """Creates (Service, Deployment, the Lease), updates (a Deployment rolled by a Dataplane
    edit, the Lease's renewals), status patches: each with fieldManager=stunner-reconciler."""
    lease = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.2}

    async def main() -> None:
        with FakeApiServer() as fake:
            k.world(fake)
            async with k.reconciler(fake, tmp_path, leader_elect=True, **lease) as running:
                await k.settled(running, fake)
                k.scale_dataplane(fake, 2)
                await k.eventually(
                    lambda: any(m == "PUT" and "/deployments/" in p for m, p, _ in request_lines)
                )
                await k.eventually(
                    lambda: any(m == "PUT" and "/leases/" in p for m, p, _ in request_lines)
                )

    asyncio.run(main())
    writes = [(m, p, q) for m, p, q in request_lines if m in ("POST", "PUT", "PATCH")]
    kinds = {(m, p.split("/")[-2] if m != "POST" else p.split("/")[-1]) for m, p, _ in writes}
    assert {
        ("POST", "services"),
        ("POST", "deployments"),
        ("POST", "leases"),
        ("PUT", "deployments"),
        ("PUT", "leases"),
    } <= kinds
    assert any(p.endswith("/status") for m, p, _ in writes if m == "PATCH")
    unnamed = [(m, p) for m, p, q in writes if q.get("fieldManager") != [FIELD_MANAGER]]
    assert unnamed == []
