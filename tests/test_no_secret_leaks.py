"""The secrets audit: no credential (static password, shared secret, a password derived from it,
a TLS private key, any Secret data) shows in a log line at any level, a status condition, a
finding, an error message or CLI output, unless the output's purpose is to hand credentials out
(`--show-secrets`, `ice`, the auth service's `/` and `/ice`).

One world holds a static and an ephemeral GatewayConfig, one whose authRef Secret holds the
password, one whose authRef Secret holds a bad `type` value (Secret data in an error path) and a
TLS Gateway with a real key. It is driven through cluster mode (the fake API server, a refused
write), local mode (files, the auth service, a broken manifest), render, the CLI and the webhook;
every captured text is scanned for every secret value, raw and base64-encoded.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from reconciler.cds.server import cds_app
from reconciler.cds.store import ConfigStore
from reconciler.local import LocalSettings, run_local
from reconciler.render import RenderSettings, render
from reconciler.render import credentials as render_credentials
from reconciler.store import Snapshot
from stunner_api.rules import Settings
from stunner_api.vocabulary import CDS_TOKEN_AUDIENCE
from stunner_cli.__main__ import main as stunner
from tests.reconciler import clusterkit as k
from tests.support.background import Background
from tests.support.fakeapi import FakeApiServer
from tests.support.objects import cds_service, secret
from tests.support.pki import key_pem, self_signed
from tests.webhook.conftest import admission_review, answer
from webhook import create_app
from webhook.kube import KubeLookup

STATIC_PASSWORD = "StaticPw-7f3a9c"
STATIC_USER = "StaticUser-2d41"
SHARED_SECRET = "SharedSecret-5b1e0d"
REF_PASSWORD = "RefPw-91c2e4"
TYPE_IN_SECRET = "TypeLeak-0a8b"  # Secret data in the `type` key: no message may echo it
TLS_KEY = ec.generate_private_key(ec.SECP256R1())
KEY_PEM = key_pem(TLS_KEY)
CERT_PEM = self_signed(TLS_KEY)


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()


def needles(*derived: str) -> list[str]:
    """Every secret value as it may show: raw, base64 (a Secret's `data`), a PEM body line."""
    raw = [STATIC_PASSWORD, SHARED_SECRET, REF_PASSWORD, TYPE_IN_SECRET, *derived]
    key_line = KEY_PEM.decode().splitlines()[2]  # a line of the key's body, not its header
    return [*raw, *(_b64(v) for v in raw), key_line, _b64(KEY_PEM)[80:140]]


def leaks(texts: Iterable[str], *derived: str) -> list[str]:
    found = []
    for text in texts:
        found += [f"{needle!r} in {text[:300]!r}" for needle in needles(*derived) if needle in text]
    return found


def _class_and_config(name: str, **spec: Any) -> list[dict[str, Any]]:
    gateway_class = k.gateway_class(name)
    gateway_class["spec"]["parametersRef"]["name"] = name
    config = k.gateway_config()
    config["metadata"]["name"] = name
    config["spec"] = spec
    return [gateway_class, config]


def world() -> list[dict[str, Any]]:
    tls = k.listener(
        "tls", 443, "TURN-TLS", tls={"mode": "Terminate", "certificateRefs": [{"name": "tls"}]}
    )
    return [
        *_class_and_config(
            "stunner", authType="static", userName=STATIC_USER, password=STATIC_PASSWORD
        ),
        *_class_and_config("ephemeral", authType="ephemeral", sharedSecret=SHARED_SECRET),
        *_class_and_config("byref", authRef={"name": "auth"}),
        *_class_and_config("badref", authRef={"name": "badauth"}),
        secret("auth", type="static", username=STATIC_USER, password=REF_PASSWORD),
        secret("badauth", type=TYPE_IN_SECRET, secret=SHARED_SECRET),
        secret("tls", "kubernetes.io/tls", **{"tls.crt": CERT_PEM, "tls.key": KEY_PEM}),
        k.dataplane(),
        k.static_service(),
        k.gateway(k.listener(), tls, name="gw"),
        _addressed(k.gateway(name="eph", gateway_class="ephemeral")),  # `ice` prints its URIs
        k.gateway(name="ref", gateway_class="byref"),
        k.gateway(name="bad", gateway_class="badref"),
        k.route(parents=("gw", "eph", "ref", "bad")),
    ]


def _addressed(gateway: dict[str, Any]) -> dict[str, Any]:
    """A Gateway with a public address (its spec.addresses), so `stunner ice` answers for it."""
    gateway["spec"]["addresses"] = [{"type": "IPAddress", "value": "192.0.2.10"}]
    return gateway


def log_texts(records: Iterable[logging.LogRecord]) -> list[str]:
    formatter = logging.Formatter()
    return [formatter.format(record) for record in records]


@pytest.fixture
def everything(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog at the lowest level, for every logger (the kubernetes client's and aiohttp's too)."""
    caplog.set_level(1)
    yield caplog


# --- render -------------------------------------------------------------------------------------


def test_render_statuses_and_findings_hold_nosecret() -> None:
    plan = render(
        Snapshot.from_objects(world()), RenderSettings(), datetime.datetime.now(datetime.UTC)
    )
    assert set(plan.configs) == {f"{k.NS}/gw", f"{k.NS}/eph", f"{k.NS}/ref"}  # bad: no auth
    assert plan.configs[f"{k.NS}/ref"].auth.credentials["password"] == REF_PASSWORD
    texts = [json.dumps(u.status) for u in plan.statuses] + [str(f) for f in plan.findings]
    assert any("Secret stunner/badauth" in t for t in texts), texts  # the error is reported
    assert leaks(texts) == []


# --- cluster mode -------------------------------------------------------------------------------


def _statuses_and_events(fake: FakeApiServer) -> list[str]:
    with fake._cond:
        objects = list(fake._objects.values())
    return [
        json.dumps(obj if obj.get("kind") == "Event" else obj.get("status"), default=str)
        for obj in objects
    ]


def _get(url: str, token: str = "") -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=headers), timeout=5
    ) as response:
        return str(response.read().decode())


def test_cluster_mode_logs_statuses_and_metrics_hold_nosecret(
    everything: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    tokens: list[str] = []  # the CDS token a stunnerd would show: never logged either

    async def main() -> list[str]:
        with FakeApiServer() as fake:
            for obj in world():
                fake.seed(obj)
            fake.refuse("PUT", "deployments", 422)  # a refused write is logged
            fake.refuse("POST", "deployments", 422)
            fake.refuse("PATCH", "deployments", 422)
            token = fake.issue_token(k.NS, "gw-stunnerd", (CDS_TOKEN_AUDIENCE,))
            tokens.append(token)
            async with k.reconciler(fake, tmp_path) as running:
                await k.settled(running, fake)
                k.update(  # static -> ephemeral: the change path logs too
                    fake,
                    "stunner.l7mp.io/v1",
                    "GatewayConfig",
                    "stunner",
                    lambda o: o.__setitem__(
                        "spec", {"authType": "ephemeral", "sharedSecret": SHARED_SECRET}
                    ),
                )
                fake.refuse("PUT", "deployments", None)
                fake.refuse("POST", "deployments", None)
                fake.refuse("PATCH", "deployments", None)
                await asyncio.sleep(0.5)
                await k.settled(running, fake)
                assert running.metrics_address is not None
                metrics = await asyncio.to_thread(_get, f"{running.metrics_address}/metrics")
                cds = await asyncio.to_thread(
                    _get, f"{running.cds_address}/api/v1/configs/{k.NS}/gw", token
                )
                assert leaks([cds]) != []  # the CDS hands the dataplane its credentials
            return [*_statuses_and_events(fake), metrics]

    texts = asyncio.run(main())
    logged = log_texts(everything.records)
    assert any("refused" in line for line in logged), "the refused write was not exercised"
    assert any("badauth" in t for t in texts), "the bad authRef Secret was not reported"
    assert leaks(texts + logged, *tokens) == []


# --- local mode ---------------------------------------------------------------------------------


def write_manifests(directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "world.yaml").write_text(yaml.safe_dump_all(world()))
    return directory


def test_local_mode_logs_hold_no_secret_nor_a_derived_password(
    everything: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    manifests = write_manifests(tmp_path / "manifests")
    settings = LocalSettings(manifests, cds_port=0, auth_port=0, poll_interval=0.05)

    async def main() -> list[str]:
        async with run_local(settings) as local:
            await local.rendered(1)
            handed: list[str] = []
            for query in (
                f"/ice?service=turn&namespace={k.NS}&gateway=eph&username=alice",
                f"/?service=turn&namespace={k.NS}&gateway=eph&username=alice",
                f"/ice?service=turn&namespace={k.NS}&gateway=gw",
                f"/ice?service=turn&namespace={k.NS}&gateway=nosuch",  # an error is logged
            ):
                try:
                    handed.append(await asyncio.to_thread(_get, local.auth_address + query))
                except urllib.error.HTTPError as e:
                    assert e.code == 404, e
            broken = manifests / "broken.yaml"  # a bad manifest is logged, its content is not
            broken.write_text(f"kind: Secret\ndata: {{password: {STATIC_PASSWORD}\n")
            renders = local.reconciler.renders
            (manifests / "world.yaml").write_text(
                yaml.safe_dump_all(world()).replace(STATIC_PASSWORD, STATIC_PASSWORD + "x")
            )
            await local.rendered(renders + 1)
        return handed

    handed = asyncio.run(main())
    derived = [
        server["credential"]
        for answer in map(json.loads, handed[:1])
        for server in answer["iceServers"]
    ]
    assert derived and SHARED_SECRET not in derived
    assert leaks(handed, *derived) != []  # the auth service's purpose is handing them out
    logged = log_texts(everything.records)
    assert any("broken.yaml" in line for line in logged), logged
    assert leaks(logged, *derived, STATIC_PASSWORD + "x") == []


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_offline_commands_hide_secrets_unless_asked(
    everything: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifests = str(write_manifests(tmp_path / "manifests"))
    shown: list[str] = []
    for args in (["render", "-f", manifests], ["render", "-f", manifests, "-o", "json"]):
        assert stunner(args) == 0
        shown += capsys.readouterr()
    assert stunner(["check", "-f", manifests]) == 1  # the bad authRef is an error
    shown += capsys.readouterr()
    (tmp_path / "broken.yaml").write_text(f"kind: Secret\ndata: {{password: {STATIC_PASSWORD}\n")
    assert stunner(["check", "-f", str(tmp_path / "broken.yaml")]) == 1
    shown += capsys.readouterr()
    assert any("badauth" in text for text in shown)
    assert leaks(shown + log_texts(everything.records)) == []
    assert stunner(["render", "-f", manifests, "--show-secrets"]) == 0
    assert leaks([capsys.readouterr().out]) != []  # asked for: shown


def test_cli_cluster_commands_hide_secrets_unless_asked(
    everything: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plan = render(
        Snapshot.from_objects(world()), RenderSettings(), datetime.datetime.now(datetime.UTC)
    )
    store = ConfigStore()
    store.publish(dict(plan.configs))
    background = Background()
    try:
        cds = background.serve(cds_app(store))
        with FakeApiServer() as fake:
            for obj in world():
                fake.seed(obj)
            fake.seed(cds_service("stunner-system"))
            fake.proxy("stunner-system", "services", "stunner-config-discovery", 13478, cds)
            kube = ["--kubeconfig", str(fake.write_kubeconfig(tmp_path / "kubeconfig"))]
            manifests = str(write_manifests(tmp_path / "manifests"))
            shown: list[str] = []
            for args in (
                ["config"],
                ["config", "-o", "json"],
                ["config", f"{k.NS}/eph", "-o", "yaml"],
                ["status"],
                ["diff", "-f", manifests],
            ):
                stunner([*args, *kube])
                shown += capsys.readouterr()
            assert any("Authentication type: ephemeral" in text for text in shown), shown
            assert leaks(shown + log_texts(everything.records)) == []
            assert stunner(["config", "-o", "json", "--show-secrets", *kube]) == 0
            assert leaks([capsys.readouterr().out]) != []  # asked for: shown
            assert stunner(["ice", f"{k.NS}/eph", *kube]) == 0  # its purpose: credentials
            assert leaks([capsys.readouterr().out]) == []  # derived, never the shared secret
    finally:
        background.close()


# --- the webhook --------------------------------------------------------------------------------


def test_webhook_answers_and_logs_hold_nosecret(everything: pytest.LogCaptureFixture) -> None:
    with FakeApiServer() as fake:
        for obj in world():
            if obj["kind"] == "Secret":
                fake.seed(obj)
        lookup = KubeLookup(fake.api_client(), timeout=2.0)
        try:
            answers = _admit(create_app(Settings(), lookup).test_client())
        finally:
            lookup.close()
    assert any('"allowed": false' in a for a in answers), answers
    assert leaks(answers + log_texts(everything.records)) == []


def _admit(client: Any) -> list[str]:
    bad_inline = k.gateway_config(password=f"{STATIC_PASSWORD} with spaces")
    answers = []
    for obj in (
        bad_inline,
        *_class_and_config("badref", authRef={"name": "badauth"})[1:],
        *_class_and_config("byref", authRef={"name": "auth"}, password=STATIC_PASSWORD)[1:],
    ):
        for path in ("/validate", "/mutate"):
            answers.append(json.dumps(answer(client, path, admission_review(obj))))
    return answers


def test_render_auth_error_does_not_echo_the_secrets_type_value() -> None:
    """Render's own check of the authRef Secret (the rules catch a bad type first; render must
    not rely on it): the message names the Secret, not what it holds."""
    objects = world()
    (config,) = [
        o for o in objects if o["kind"] == "GatewayConfig" and o["metadata"]["name"] == "badref"
    ]
    with pytest.raises(render_credentials.AuthError) as error:
        render_credentials.auth(config, Snapshot.from_objects(objects))
    assert str(error.value) == "invalid authentication type in Secret stunner/badauth"
    inline = k.gateway_config(authType="nosuch")
    with pytest.raises(render_credentials.AuthError, match="invalid authentication type 'nosuch'"):
        render_credentials.auth(inline, Snapshot.from_objects(objects))
