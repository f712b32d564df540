"""The config discovery service's store: the rendered dataplane configs by id
(`<namespace>/<gateway>`), the watchers of each, the Nodes' public addresses, the Gateways'
dataplane pods, and the usage board of cluster-wide user quotas; the HTTP and WebSocket side
that serves it is reconciler.cds.

`ConfigStore.publish(configs)` makes the store hold exactly `configs` (level-based): a changed
config is offered to its watchers, a removed one as the zero config (so its stunnerd drains) and
forgotten. Every watcher has its own bounded queue (`Watcher.offer`): at most one pending frame
per id, a newer one replacing an older one not sent yet (latest config wins).

Relay address discovery (Go's node patcher): `set_nodes` holds each Node's public address
(ExternalIP, else ExternalDNS resolved here, else the Node's relay-address annotation); a
watcher's or a request's configs have every listener address that is the node placeholder
replaced with its Node's address (`patched`), else with `$STUNNER_ADDR`, and a watcher is
offered its config again when its Node's address changes. `node_local` is render's per-Gateway
list of the public addresses of the Nodes it runs on (the auth service's per-node ICE URIs).

Cluster-wide user quotas: `usage` (reconciler.cds.usage) takes the watchers' usage reports and
tells them the others'; the store keeps it told of each config's quota.

Secrets are in the configs and nowhere else: logs name ids, never content.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from stunner_api.cds import (
    POD_ADDRESS,
    REPORT_INTERVAL,
    config_id,
    has_node_placeholder,
    patch_node_address,
)
from stunner_api.dataplane import StunnerConfig, zero_config
from stunner_api.endpoints import is_ip

from .access import Allowed
from .quota import PodClaim
from .sessions import SessionBoard
from .usage import UsageDesk

log = logging.getLogger("stunner.cds-server")


def _user_quota(text: str) -> int:
    """The `admin.user_quota` of a config's JSON, 0 when it has none (or is no config)."""
    try:
        admin = json.loads(text).get("admin")
        quota = admin.get("user_quota") if isinstance(admin, dict) else 0
    except (ValueError, AttributeError):
        return 0
    return quota if type(quota) is int and quota > 0 else 0


@dataclass(frozen=True)
class Selector:
    """What a watcher or a GET asks for: every config, one namespace's, or one id."""

    namespace: str = ""
    name: str = ""
    # The caller's access (reconciler.cds.access), asked anew for every config; None: all.
    allowed: Allowed | None = field(default=None, compare=False)

    def matches(self, id: str) -> bool:
        if self.allowed is not None and not self.allowed(id):
            return False
        if self.name:
            return id == config_id(self.namespace, self.name)
        return not self.namespace or id.startswith(self.namespace + "/")

    def __str__(self) -> str:
        if self.name:
            return config_id(self.namespace, self.name)
        return f"{self.namespace}/*" if self.namespace else "*"


@dataclass(eq=False)
class Watcher:
    """One WebSocket client: its selector and its pending frames (one per id, latest wins)."""

    selector: Selector
    peer: str
    node: str = ""  # the `node` parameter: whose public address the placeholder becomes
    # Where the CDS checks tokens (reconciler.cds.access): the pod the watcher may report usage
    # as (its token's), None when it may not; where it checks none, every watcher reports.
    authenticated: bool = False
    pod: PodClaim | None = None
    # Sessions (reconciler.cds.sessions): the pod it answers for, once it said it speaks them.
    sessions_pod: str = ""
    pending: dict[str, str] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def config(self) -> str:
        """The one config it watches (a usage report needs one)."""
        return str(self.selector)

    @property
    def may_report(self) -> bool:
        return not self.authenticated or self.pod is not None

    def reporter(self) -> Hashable:
        """Whom its reports count for: its pod (one report per pod), else itself."""
        if self.pod is None:
            return self
        return (self.config, self.pod.name, self.pod.uid)

    def offer(self, id: str, text: str) -> None:
        self.pending.pop(id, None)  # re-insert: frames go out in the order of their last change
        self.pending[id] = text
        self.ready.set()

    async def take(self) -> list[str]:
        """Every pending frame, once there is at least one."""
        await self.ready.wait()
        self.ready.clear()
        frames = list(self.pending.values())
        self.pending.clear()
        return frames


class ConfigStore:
    """The published configs (as Go's JSON) and the watchers to tell about changes."""

    def __init__(self, usage_interval: float = REPORT_INTERVAL) -> None:
        self._configs: dict[str, StunnerConfig] = {}
        self._texts: dict[str, str] = {}
        self.watchers: set[Watcher] = set()
        self.dropped_watchers = 0
        # Cluster-wide user quotas: the reports of the watchers that send them.
        self.usage = UsageDesk(usage_interval)
        # Sessions: the requests to the pods in flight (reconciler.cds.sessions).
        self.sessions = SessionBoard()
        # Relay address discovery: Node name -> its public address as given (ExternalIP or
        # ExternalDNS), and the IP address each resolves to (an IP resolves to itself).
        self._node_names: dict[str, str] = {}
        # Config id -> where clients reach a Gateway with a stunnerd on every node (render's
        # Plan.node_local: the public addresses of the Nodes it runs on), for the auth service.
        self.node_local: dict[str, tuple[str, ...]] = {}
        self._node_ips: dict[str, str] = {}
        self._resolving: asyncio.Task[None] | None = None

    @property
    def configs(self) -> Mapping[str, StunnerConfig]:
        return self._configs

    def text(self, id: str) -> str | None:
        return self._texts.get(id)

    def select(self, selector: Selector, node: str = "") -> dict[str, str]:
        """The JSON of every config `selector` matches, by id in id order, patched for the
        stunnerd on Node `node` (`patched`)."""
        return {
            id: self.patched(self._texts[id], node)
            for id in sorted(self._texts)
            if selector.matches(id)
        }

    # --- relay address discovery ----------------------------------------------------------

    def node_address(self, node: str) -> str:
        """The relay address a stunnerd on Node `node` hands clients: the Node's public IP
        address, else its pod's own (`$STUNNER_ADDR`)."""
        return self._node_ips.get(node, POD_ADDRESS) if node else POD_ADDRESS

    @property
    def node_names(self) -> Mapping[str, str]:
        """Node name -> its public address as given to `set_nodes` (an IP or a DNS name)."""
        return dict(self._node_names)

    def patched(self, text: str, node: str) -> str:
        """A config's JSON as the stunnerd on Node `node` gets it (the node placeholder
        replaced, `node_address`); as it is without a node (Go's: the auth service and the CLI
        see which listeners have a stunnerd per node; stunnerd's own client patches it to
        `$STUNNER_ADDR` when it has no node name)."""
        if not node or not has_node_placeholder(text):
            return text
        return patch_node_address(text, self.node_address(node))

    def set_nodes(self, addresses: Mapping[str, str]) -> None:
        """Node name -> public address (an IP, or a DNS name resolved in the background on the
        running loop; one that does not resolve counts as none). Watchers whose Node's address
        changed get their configs with a placeholder again."""
        if dict(addresses) == self._node_names:
            return
        self._node_names = dict(addresses)
        ips = {node: a for node, a in addresses.items() if is_ip(a)}
        names = {node: a for node, a in addresses.items() if not is_ip(a)}
        # A name keeps its last resolved address until it resolves again.
        ips |= {node: self._node_ips[node] for node in names if node in self._node_ips}
        self._set_node_ips(ips)
        if self._resolving is not None:
            self._resolving.cancel()
            self._resolving = None
        if names:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                log.warning("cannot resolve the ExternalDNS of Nodes %s here", sorted(names))
                return
            self._resolving = loop.create_task(self._resolve(names, ips))

    async def _resolve(self, names: Mapping[str, str], ips: Mapping[str, str]) -> None:
        loop = asyncio.get_running_loop()
        resolved = dict(ips)
        for node, name in sorted(names.items()):
            try:
                infos = await loop.getaddrinfo(name, None, type=socket.SOCK_DGRAM)
            except OSError as exc:
                log.warning("Node %s: ExternalDNS %s does not resolve: %s", node, name, exc)
                resolved.pop(node, None)
                continue
            found = [str(info[4][0]) for info in infos]
            v4 = [a for a in found if ":" not in a]
            resolved[node] = (v4 or found)[0]
        self._set_node_ips(resolved)

    def _set_node_ips(self, ips: Mapping[str, str]) -> None:
        old, self._node_ips = self._node_ips, dict(ips)
        changed = {n for n in old.keys() | ips.keys() if old.get(n) != ips.get(n)}
        for node in sorted(changed):
            log.info("relay address of Node %s: %s", node, self.node_address(node))
        for watcher in self.watchers:
            if watcher.node not in changed:
                continue
            for id, text in self._texts.items():
                if has_node_placeholder(text) and watcher.selector.matches(id):
                    watcher.offer(id, self.patched(text, watcher.node))

    def set(self, id: str, config: StunnerConfig) -> bool:
        """Store the config of `id`; push it to its watchers if it changed. True if it did."""
        changed = self.set_json(id, config.to_json(), config.admin.user_quota)
        self._configs[id] = config
        return changed

    def set_json(self, id: str, text: str, user_quota: int | None = None) -> bool:
        """Serve `text` as the config of `id`, as is (a config rendered elsewhere; the auth
        endpoints see only configs stored with `set`); push it to its watchers if it changed.
        `user_quota`: its `admin.user_quota` (None: read from `text`)."""
        old = self._texts.get(id)
        if old == text:
            return False
        self._configs.pop(id, None)
        self.usage.set_quota(id, _user_quota(text) if user_quota is None else user_quota)
        self._texts[id] = text
        self._notify(id, text)
        log.info("config %s %s", id, "added" if old is None else "updated")
        return True

    def delete(self, id: str) -> bool:
        """Forget `id` and push the zero config to its watchers. True if it was there."""
        if self._texts.pop(id, None) is None:
            return False
        self._configs.pop(id, None)
        self.usage.config_gone(id)
        self._notify(id, zero_config(id).to_json())
        log.info("config %s deleted: its watchers get the zero config", id)
        return True

    def publish(self, configs: Mapping[str, StunnerConfig]) -> list[str]:
        """Make the store hold exactly `configs`; the ids that changed (deleted ones included)."""
        changed = [id for id in sorted(self._texts.keys() - configs.keys()) if self.delete(id)]
        changed += [id for id in sorted(configs) if self.set(id, configs[id])]
        return changed

    # --- cluster-wide user quotas -----------------------------------------------------------

    def forget(self, watcher: Watcher) -> None:
        """`watcher` is gone: no more configs to it, and its counts no longer count."""
        self.watchers.discard(watcher)
        self.usage.forget(watcher)
        self.sessions.forget(watcher)

    def answering(self, id: str) -> list[Watcher]:
        """The watchers of config `id` that answer sessions requests (a pod each)."""
        return [w for w in self.watchers if w.sessions_pod and w.config == id]

    def _notify(self, id: str, text: str) -> None:
        for watcher in self.watchers:
            if watcher.selector.matches(id):
                watcher.offer(id, self.patched(text, watcher.node))
