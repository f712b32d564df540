"""Render of the GatewayConfig's sessions fields (issue 29): `revokedUsers` becomes the
dataplane's `auth.revoked_users` (sorted, once each, empty ids left out) and `strictExpiry:
true` its `auth.strict_expiry`, `allocationBandwidthLimit` (bits per second) its
`auth.allocation_bandwidth_limit`; unset, the auth section is Go's, byte for byte; the dataplane
model takes them back and serializes them the same."""

from __future__ import annotations

from typing import Any

from reconciler.render.credentials import auth
from reconciler.store import Snapshot
from stunner_api.dataplane import AuthConfig


def gatewayconfig(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "stunner.l7mp.io/v1",
        "kind": "GatewayConfig",
        "metadata": {"name": "gwc", "namespace": "stunner"},
        "spec": {"authType": "ephemeral", "sharedSecret": "s3cret", **spec},
    }


def test_revoked_users_and_strict_expiry_are_rendered_into_auth() -> None:
    rendered = auth(
        gatewayconfig(revokedUsers=["bob", "alice", "bob", ""], strictExpiry=True), Snapshot({})
    )
    assert rendered["revoked_users"] == ["alice", "bob"]
    assert rendered["strict_expiry"] is True
    model = AuthConfig.model_validate(rendered)
    assert model.to_dict()["revoked_users"] == ["alice", "bob"]
    assert model.to_dict()["strict_expiry"] is True
    assert "revoked=2" in str(model) and "strict-expiry=true" in str(model)
    assert "alice" not in str(model)  # the status line counts them, it does not list them


def test_the_bandwidth_limit_is_rendered_into_auth() -> None:
    rendered = auth(gatewayconfig(allocationBandwidthLimit=2_000_000), Snapshot({}))
    assert rendered["allocation_bandwidth_limit"] == 2_000_000
    model = AuthConfig.model_validate(rendered)
    assert model.to_dict()["allocation_bandwidth_limit"] == 2_000_000
    assert "bandwidth-limit=2000000bps" in str(model)
    # 0 is no cap: nothing rendered, as unset
    assert "allocation_bandwidth_limit" not in auth(
        gatewayconfig(allocationBandwidthLimit=0), Snapshot({})
    )


def test_unset_they_leave_gos_auth_section_as_it_was() -> None:
    rendered = auth(
        gatewayconfig(strictExpiry=False, revokedUsers=[], allocationBandwidthLimit=0),
        Snapshot({}),
    )
    assert set(rendered) == {"type", "realm", "credentials"}
    assert set(AuthConfig.model_validate(rendered).to_dict()) == {"type", "realm", "credentials"}
