"""Where stunnerd gets its config from: a file, or the config discovery service (CDS).

`source_for(origin, id)` picks the source by the origin's form (see `source_for`). Every source
has the same two operations:

- `await source.load()`: one-shot, for stunnerd without `-w`. A bad config raises `ConfigError`
  (its message names the field); an unreachable or missing origin raises `SourceError`.
- `async for config in source.watch()`: every new valid config, forever (cancel the consumer to
  stop). An invalid config is logged with the reason and skipped, so a running daemon keeps its
  config; a config identical to the last one yielded is not yielded again. The watch never fails:
  a missing file or an unreachable CDS is retried every `retry_period` seconds.

With STUNNER_CDS_TOKEN_FILE set (the rendered Deployment sets it to its projected ServiceAccount
token), the CDS client reads that file at every request and (re)connect, since the kubelet
rotates it, and sends `Authorization: Bearer <token>`; without it, or with no file there, no
header is sent (local mode, a hand-written config). A refused watch (401, 403) keeps the running
config and retries with back-off, `retry_period` doubling up to 15 s. The token is never logged.
The CDS side is spoken by the one CDS client, stunner_client.cds.CdsClient.

The CDS watch ignores the zero config, which the CDS sends when the Gateway is deleted: a draining
stunnerd keeps serving its last config (Go's `suppressDelete`). With a `reporter` (cluster-wide
user quotas, stunnerd.process.usage), its reports are sent on the watch and the CDS's usage frames
go to
it, never taken for configs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Protocol

from stunner_api.cds import (
    DEFAULT_ADDRESS,
    DEFAULT_PORT,
    NODE_ENV,
    NODE_PARAM,
    PING_PERIOD,
    POD_ADDRESS,
    PONG_WAIT,
    RETRY_PERIOD,
    USAGE_OTHERS_KEY,
    InvalidId,
    config_path,
    has_node_placeholder,
    patch_node_address,
    split_id,
    usage_key,
)
from stunner_api.dataplane import ConfigError, StunnerConfig, is_zero_config
from stunner_api.dataplane_load import load_config_checked
from stunner_api.sessions import frame_key
from stunner_api.vocabulary import CDS_SERVICE_NAME, SYSTEM_NAMESPACE
from stunner_client.cds import CdsClient, CdsError, Reporter

file_log = logging.getLogger("stunner.config-file-client")
cds_log = logging.getLogger("stunner.cds-client")

DEFAULT_CDS_ADDRESS = DEFAULT_ADDRESS
DEFAULT_NAMESPACE = "default"
FILE_POLL_INTERVAL = 0.25

# host:port, :port or [v6]:port, with no scheme: the address of a CDS server.
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.%\w]*\]|[^/\\:\[\]]*):(\d{1,5})")


class SourceError(Exception):
    """The config origin cannot be used: unreachable, missing, or not supported."""


Checked = tuple[StunnerConfig, list[str]]  # a config and what it most likely got wrong


class ConfigSource(Protocol):
    """A config origin: one-shot `load()` and a never-ending, deduplicated `watch()`; both log
    the config's warnings (unknown keys, routes to missing clusters); `load_checked()` returns
    them instead (--dry-run makes them errors)."""

    async def load_checked(self) -> Checked: ...

    async def load(self) -> StunnerConfig: ...

    def watch(self) -> AsyncIterator[StunnerConfig]: ...


class UsageLink(Reporter, Protocol):
    """A `Reporter` that also takes the CDS's frames that are not configs: usage frames and
    sessions commands (stunnerd.process.sessions.WatchLink)."""

    def takes(self, frame: str | bytes) -> bool: ...

    def received(self, frame: str | bytes) -> None: ...


class FileSource:
    """A config file, watched by polling its (mtime, size, inode); no inotify needed.

    A zero-length file is skipped (a writer truncated it and has not written yet). A missing file
    is retried every `retry_period` seconds; this is logged once, not on every poll.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        env: Mapping[str, str] | None = None,
        poll_interval: float = FILE_POLL_INTERVAL,
        retry_period: float = RETRY_PERIOD,
    ) -> None:
        self.path = Path(path)
        self.env = env
        self.poll_interval = poll_interval
        self.retry_period = retry_period

    def __repr__(self) -> str:
        return f"FileSource({str(self.path)!r})"

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise SourceError(f"cannot read config file {self.path}: {exc.strerror}") from None

    async def load_checked(self) -> Checked:
        text = await asyncio.to_thread(self._read)
        try:
            return load_config_checked(text, self.env)
        except ConfigError as exc:
            raise ConfigError(f"{self.path}: {exc}") from None

    async def load(self) -> StunnerConfig:
        config, warnings = await self.load_checked()
        log_warnings(file_log, str(self.path), warnings)
        return config

    async def watch(self) -> AsyncGenerator[StunnerConfig, None]:
        last_json: str | None = None
        last_stat: tuple[int, int, int] | None = None
        missing = False
        while True:
            try:
                stat = self.path.stat()
                text = (
                    self._read()
                    if (stat.st_mtime_ns, stat.st_size, stat.st_ino) != last_stat
                    else None
                )
            except (OSError, SourceError) as exc:
                if not missing:
                    file_log.warning(
                        "config file %s is not available (%s); retrying every %gs",
                        self.path,
                        exc.strerror if isinstance(exc, OSError) else exc,
                        self.retry_period,
                    )
                    missing = True
                last_stat = None
                await asyncio.sleep(self.retry_period)
                continue
            if missing:
                file_log.info("config file %s is available again", self.path)
                missing = False
            if text is not None:
                last_stat = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
                config = self._parse(text)
                if config is not None:
                    config_json = config.to_json()
                    if config_json == last_json:
                        file_log.debug("config file %s: config unchanged, ignoring", self.path)
                    else:
                        last_json = config_json
                        file_log.debug("config file %s: new config", self.path)
                        yield config
            await asyncio.sleep(self.poll_interval)

    def _parse(self, text: bytes) -> StunnerConfig | None:
        if not text:
            file_log.debug(
                "config file %s is empty (truncated during a write?), ignoring", self.path
            )
            return None
        try:
            config, warnings = load_config_checked(text, self.env)
        except ConfigError as exc:
            file_log.warning("ignoring invalid config in %s: %s", self.path, exc)
            return None
        log_warnings(file_log, str(self.path), warnings)
        return config


class CdsSource:
    """The config discovery service: `GET` once, or a WebSocket stream of full configs, through
    the one CDS client (stunner_client.cds, which the auth service shares).

    The watch pings the server every `ping_period` seconds and drops the connection when a ping
    is unanswered for `pong_wait` seconds; after any failure it reconnects every `retry_period`
    seconds, forever.
    """

    def __init__(
        self,
        address: str,
        namespace: str,
        name: str,
        *,
        node: str | None = None,
        env: Mapping[str, str] | None = None,
        retry_period: float = RETRY_PERIOD,
        ping_period: float = PING_PERIOD,
        pong_wait: float = PONG_WAIT,
    ) -> None:
        """`address`: `http(s)://host:port`, `ws(s)://host:port`, `host:port` or `:port`."""
        self.address = address
        self.namespace = namespace
        self.name = name
        self.node = node
        self.env = env
        self.retry_period = retry_period
        self.ping_period = ping_period
        self.pong_wait = pong_wait
        try:
            self.client = CdsClient(
                address,
                env=env,
                retry_period=retry_period,
                ping_period=ping_period,
                pong_wait=pong_wait,
                logger=cds_log,
            )
        except CdsError as exc:
            raise SourceError(str(exc)) from None
        self.path = config_path(namespace, name)
        self.reporter: UsageLink | None = None  # cluster-wide user quotas, on the watch
        self.query = {NODE_PARAM: node} if node else {}
        self.origin = self.client.origin
        self.url = self.client.url(self.path, self.query)
        self.ws_url = self.client.ws_url(self.path, self.query)

    def __repr__(self) -> str:
        return f"CdsSource({self.origin!r}, {self.namespace}/{self.name})"

    def auth_headers(self) -> dict[str, str]:
        """`Authorization: Bearer` with the token file's current content; {} without one."""
        return self.client.auth_headers()

    def _get(self) -> bytes:
        try:
            return self.client.get(
                self.path, self.query, what=f"config {self.namespace}/{self.name}"
            )
        except CdsError as exc:
            raise SourceError(str(exc)) from None

    async def load_checked(self) -> Checked:
        cds_log.debug("GET %s", self.url)
        body = await asyncio.to_thread(self._get)
        return load_config_checked(self._patched(body), self.env)

    def _patched(self, text: str | bytes) -> str | bytes:
        """Without a node name the CDS leaves the node placeholder (relay address discovery) in
        place, as Go's: this stunnerd's address is then the pod's own, `$STUNNER_ADDR`."""
        if self.node:
            return text
        decoded = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        if not has_node_placeholder(decoded):
            return text
        return patch_node_address(decoded, POD_ADDRESS)

    async def load(self) -> StunnerConfig:
        config, warnings = await self.load_checked()
        log_warnings(cds_log, self.url, warnings)
        return config

    async def watch(self) -> AsyncGenerator[StunnerConfig, None]:
        last_json: str | None = None
        what = f"{self.namespace}/{self.name}"
        frames = self.client.watch(self.path, self.query, what=what, reporter=self.reporter)
        async for message in frames:
            if self.reporter is not None and self.reporter.takes(message):
                self.reporter.received(message)
                continue
            if usage_key(message) == USAGE_OTHERS_KEY or frame_key(message) is not None:
                continue  # not a config: without a reporter, not ours to take
            checked = self._parse(message)
            if checked is None:
                continue
            config, warnings = checked
            config_json = config.to_json()
            if config_json == last_json:
                cds_log.debug("config unchanged, ignoring")
                continue
            last_json = config_json
            log_warnings(cds_log, self.ws_url, warnings)
            yield config

    def _parse(self, message: str | bytes) -> Checked | None:
        try:
            config, warnings = load_config_checked(self._patched(message), self.env)
        except ConfigError as exc:
            cds_log.warning("ignoring invalid config from CDS server: %s", exc)
            return None
        if is_zero_config(config):
            cds_log.info(
                "config %s/%s deleted on the CDS server; keeping the running config",
                self.namespace,
                self.name,
            )
            return None
        return config, warnings


def log_warnings(logger: logging.Logger, origin: str, warnings: list[str]) -> None:
    """A valid config's likely mistakes, one line each (the config is applied as it is)."""
    for warning in warnings:
        logger.warning("config from %s: %s", origin, warning)


def resolve_id(id: str | None, env: Mapping[str, str]) -> tuple[str, str]:
    """(namespace, name): `id` as `namespace/name`, else STUNNER_NAMESPACE and STUNNER_NAME from
    `env` (both must be set), else `default/stunnerd-<hostname>`."""
    if not id:
        namespace, name = env.get("STUNNER_NAMESPACE"), env.get("STUNNER_NAME")
        if namespace and name:
            return namespace, name
        return DEFAULT_NAMESPACE, f"stunnerd-{socket.gethostname()}"
    try:
        return split_id(id)
    except InvalidId as exc:
        raise SourceError(str(exc)) from None


def source_for(
    origin: str,
    id: str | None = None,
    env: Mapping[str, str] | None = None,
    *,
    retry_period: float = RETRY_PERIOD,
    ping_period: float = PING_PERIOD,
    pong_wait: float = PONG_WAIT,
) -> ConfigSource:
    """The config source of `origin` (stunnerd `-c`):

    - `file://<path>` or a plain path: a `FileSource`;
    - `http(s)://host:port`, `ws(s)://host:port`, `host:port` or `:port` (empty: `:13478`,
      the default): a `CdsSource` for config `id` (see `resolve_id`), sending `node=` if
      STUNNER_NODENAME is set in `env`;
    - `k8s` (CDS discovery through the Kubernetes API): not supported, `SourceError`.

    `env` defaults to `os.environ`; it also feeds `$VAR` substitution in the configs.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    origin = origin.strip() or DEFAULT_CDS_ADDRESS
    if origin == "k8s":
        raise SourceError(
            "config origin 'k8s' (CDS discovery through Kubernetes) is not supported: "
            "give the CDS address, e.g. -c "
            f"http://{CDS_SERVICE_NAME}.{SYSTEM_NAMESPACE}:{DEFAULT_PORT}"
        )
    if origin.startswith("file://"):
        return FileSource(origin.removeprefix("file://"), env=env, retry_period=retry_period)
    lowered = origin.lower()
    if lowered.startswith(("http://", "https://", "ws://", "wss://")) or _HOST_PORT.fullmatch(
        origin
    ):
        namespace, name = resolve_id(id, environ)
        return CdsSource(
            origin,
            namespace,
            name,
            node=environ.get(NODE_ENV) or None,
            env=env,
            retry_period=retry_period,
            ping_period=ping_period,
            pong_wait=pong_wait,
        )
    return FileSource(origin, env=env, retry_period=retry_period)
