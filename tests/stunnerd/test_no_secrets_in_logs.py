"""Secrets never reach the logs or /status.

Every stunner log line is captured at TRACE level through a session that exercises both auth
modes, successful and failed logins, a stale nonce, relaying, a config refused for a bad
certificate, and /status; no password, shared secret, derived HMAC password or key may appear.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time

import pytest

from stunner_api.ice import ephemeral_password, ephemeral_username
from stunnerd.process.daemon import ApplyError
from stunnerd.surface import logs
from stunnerd.surface.admin import status_of
from tests.support.turnclient import (
    HOST,
    RawClient,
    free_port,
    make_config,
    running_stunner,
    start_peer,
)

STATIC_PASSWORD = "Static-Pa55word-XYZZY"
SHARED_SECRET = "Shared-Secret-PLUGH"
KEY_MATERIAL = "PRIVATE-KEY-MATERIAL-42"


def test_no_secret_in_any_log_line(caplog: pytest.LogCaptureFixture) -> None:
    username = ephemeral_username(int(time.time()) + 600, "alice")
    derived = ephemeral_password(SHARED_SECRET, username)
    secrets = [STATIC_PASSWORD, SHARED_SECRET, derived]

    async def main() -> list[str]:
        peer = await start_peer(echo=True)
        port = free_port()
        static = {
            "type": "static",
            "realm": "stunner.l7mp.io",
            "credentials": {"username": "user-1", "password": STATIC_PASSWORD},
        }
        reports = []
        async with running_stunner(make_config(port, [f"{HOST}/32"], auth=static)) as stunner:
            good = await RawClient.connect((HOST, port), password=STATIC_PASSWORD)
            await good.allocate()
            await good.channel_bind(0x4000, (HOST, peer.port))
            good.send_channel_data(0x4000, b"x")
            await asyncio.wait_for(good.channel_data.get(), 2)
            bad = await RawClient.connect((HOST, port), password="wrong-" + STATIC_PASSWORD)
            await bad.allocate()
            reports.append(repr(status_of(stunner)))
            ephemeral = {
                "type": "ephemeral",
                "realm": "stunner.l7mp.io",
                "credentials": {"secret": SHARED_SECRET},
            }
            await stunner.apply(make_config(port, [f"{HOST}/32"], auth=ephemeral))
            alice = await RawClient.connect((HOST, port), username=username, password=derived)
            await alice.allocate()
            expired = ephemeral_username(int(time.time()) - 600, "bob")
            bob = await RawClient.connect(
                (HOST, port), username=expired, password=ephemeral_password(SHARED_SECRET, expired)
            )
            await bob.allocate()
            base = make_config(port, [f"{HOST}/32"], auth=ephemeral, protocols=("TURN-UDP",))
            pem = base64.b64encode(KEY_MATERIAL.encode()).decode()
            tls_listener = base.listeners[0].model_copy(
                update={
                    "name": "testns/gw/tls",
                    "protocol": "TURN-TLS",
                    "port": free_port(),
                    "cert": pem,
                    "key": pem,
                }
            )
            bad_tls = base.model_copy(update={"listeners": [base.listeners[0], tls_listener]})
            with pytest.raises(ApplyError):
                await stunner.apply(bad_tls)
            reports.append(repr(status_of(stunner)))
            for client in (good, bad, alice, bob):
                client.close()
        peer.close()
        return reports

    logs.apply_level_spec("all:TRACE")
    try:
        with caplog.at_level(logs.TRACE, logger="stunner"):
            reports = asyncio.run(main())
    finally:
        logs.apply_level_spec(logs.DEFAULT_LEVEL_SPEC)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) > 10, "the session should have logged plenty"
    assert any("authentication failed" in line for line in lines)
    text = "\n".join(lines + reports)
    for secret in [*secrets, KEY_MATERIAL, base64.b64encode(KEY_MATERIAL.encode()).decode()]:
        assert secret not in text, f"a secret leaked: {secret[:6]}..."
    assert logging.getLogger("stunner").getEffectiveLevel() == logging.INFO
