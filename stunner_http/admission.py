"""Which connections a server admits (issue 28 #5): caps per server, per source IP and per
process, and room made for a new connection by evicting an unproven one.

The caps, checked when a connection is accepted (each "at most"):
- `max_connections` for the server, and `connections_per_source` from one source IP (the word
  and the default of stunnerd's TCP listeners, `--connections-per-source`: a NAT, or a node
  with many host-network pods, fits);
- for every server of the process together, what the `nofile` limit leaves for clients
  (`process_cap`), of which one source IP holds at most half, whichever servers it talks to: one
  client cannot take the descriptors the other servers' clients need.

Where the application proves its clients (the CDS: a request that passed its token check,
`prove`), a new connection that finds no room evicts the oldest unproven connection (of its own
source when that source is at its cap) rather than being refused; a proven connection is never
evicted. Every connection starts unproven, so an honest client always gets a place to present
its token, however many idle connections without one hold the server; to take its place again
they must open as many connections as the cap in the time its request takes.

Pure: no sockets, no clock; a connection is any hashable value the server hands in.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


@dataclass
class Holdings:
    """Open connections, in total and per source IP (a source leaves the table at zero)."""

    open: int = 0
    by_source: dict[str, int] = field(default_factory=dict)

    def of(self, source: str) -> int:
        return self.by_source.get(source, 0)

    def add(self, source: str) -> None:
        self.open += 1
        self.by_source[source] = self.by_source.get(source, 0) + 1

    def remove(self, source: str) -> None:
        self.open -= 1
        left = self.by_source.get(source, 1) - 1
        if left > 0:
            self.by_source[source] = left
        else:
            self.by_source.pop(source, None)


def source_share(process_cap: int) -> int:
    """Connections one source IP may hold in the whole process: half of what it may hold."""
    return max(1, process_cap // 2)


class Admission(Generic[C]):
    """The connections one server holds, and which of them are not proven yet."""

    def __init__(
        self,
        max_connections: int,
        connections_per_source: int,
        process: Holdings,
        evict_unproven: bool = False,
    ) -> None:
        self.max_connections = max_connections
        self.connections_per_source = connections_per_source
        self.process = process  # shared by every server of the process
        self.evict_unproven = evict_unproven
        self.held = Holdings()
        self._sources: dict[C, str] = {}
        self._unproven: dict[C, None] = {}  # in the order they came
        self._unproven_by_source: dict[str, dict[C, None]] = {}

    def source_at_cap(self, source: str, process_cap: int) -> bool:
        return self.held.of(source) >= self.connections_per_source or self.process.of(
            source
        ) >= source_share(process_cap)

    def no_room(self, source: str, process_cap: int) -> str | None:
        """Why a new connection from `source` finds no room (None: it does)."""
        if self.source_at_cap(source, process_cap):
            return "its source is at its cap"
        if self.held.open >= self.max_connections:
            return "the server is at its cap"
        if self.process.open >= process_cap:
            return "the process is at its cap"
        return None

    def victim(self, source: str, process_cap: int) -> C | None:
        """The unproven connection to evict so that one from `source` finds room, or None
        (refuse it): the oldest of its own source when that source is at its cap, else the
        oldest."""
        if not self.evict_unproven:
            return None
        if self.source_at_cap(source, process_cap):
            return next(iter(self._unproven_by_source.get(source, ())), None)
        return next(iter(self._unproven), None)

    def add(self, connection: C, source: str) -> None:
        self._sources[connection] = source
        self.held.add(source)
        self.process.add(source)
        self._unproven[connection] = None
        self._unproven_by_source.setdefault(source, {})[connection] = None

    def prove(self, connection: C) -> None:
        """The application vouches for `connection`: it is never evicted."""
        if connection not in self._unproven:
            return
        del self._unproven[connection]
        source = self._sources[connection]
        mine = self._unproven_by_source[source]
        del mine[connection]
        if not mine:
            del self._unproven_by_source[source]

    def remove(self, connection: C) -> None:
        """`connection` is gone (closed, or evicted): no longer counted. Idempotent."""
        self.prove(connection)
        source = self._sources.pop(connection, None)
        if source is not None:
            self.held.remove(source)
            self.process.remove(source)

    def proven(self, connection: C) -> bool:
        return connection in self._sources and connection not in self._unproven
