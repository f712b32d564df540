"""The restart rule: which config changes stunnerd applies in place and which restart a listener
(dropping its allocations). stunnerd applies it; `helm stunner diff` predicts with it.

Only a listener's identity restarts it: protocol, address, port, certificate or key, or the
realm (every listener's: the long-term credentials of every client change with it), or a switch
into or out of STUN-only mode (auth type `none`, every listener's: a STUN-only listener holds no
allocation, and one leaving that mode starts from none). Routes, public address and port,
clusters, credentials and admin settings change in place.
"""

from __future__ import annotations

from enum import StrEnum

from .dataplane import AuthConfig, ListenerConfig, StunnerConfig

RESTART_FIELDS = ("protocol", "address", "port", "cert", "key")


class ListenerChange(StrEnum):
    UNCHANGED = "unchanged"
    IN_PLACE = "reconciled in place"
    RESTARTED = "restarted"
    ADDED = "added"
    REMOVED = "removed"


def every_listener_restarts(old: AuthConfig | None, new: AuthConfig | None) -> bool:
    """Whether going from auth `old` to `new` restarts every listener: the realm changed, or
    STUN-only mode was switched on or off."""
    if old is None or new is None:
        return False
    return old.realm != new.realm or old.stun_only != new.stun_only


def restart_needed(old: ListenerConfig, new: ListenerConfig, realm_changed: bool) -> bool:
    """Whether going from `old` to `new` restarts the listener."""
    return realm_changed or any(getattr(old, f) != getattr(new, f) for f in RESTART_FIELDS)


def listener_changes(
    old: StunnerConfig | None, new: StunnerConfig | None
) -> dict[str, ListenerChange]:
    """What happens to each listener (by name) when a stunnerd running `old` gets `new` (None: no
    config, before the first or after the Gateway is gone)."""
    before = {lc.name: lc for lc in old.listeners} if old is not None else {}
    after = {lc.name: lc for lc in new.listeners} if new is not None else {}
    realm_changed = every_listener_restarts(old.auth if old else None, new.auth if new else None)
    changes = {}
    for name in sorted(before.keys() | after.keys()):
        if name not in after:
            changes[name] = ListenerChange.REMOVED
        elif name not in before:
            changes[name] = ListenerChange.ADDED
        elif restart_needed(before[name], after[name], realm_changed):
            changes[name] = ListenerChange.RESTARTED
        elif _served_differently(old, new, before[name], after[name]):
            changes[name] = ListenerChange.IN_PLACE
        else:
            changes[name] = ListenerChange.UNCHANGED
    return changes


def _served_differently(
    old: StunnerConfig | None, new: StunnerConfig | None, was: ListenerConfig, is_: ListenerConfig
) -> bool:
    """Whether a listener kept across the change serves its clients differently: its own fields,
    the auth, or a cluster one of its routes names."""
    if was != is_ or old is None or new is None or old.auth != new.auth:
        return True
    clusters_before = {c.name: c for c in old.clusters}
    clusters_after = {c.name: c for c in new.clusters}
    routes = set(was.routes) | set(is_.routes)
    return any(clusters_before.get(r) != clusters_after.get(r) for r in routes)
