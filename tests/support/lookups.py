"""A rule table `Lookup` whose every read fails, for the tests of what a rule does then: the
webhook's own `KubeLookup` on a fake API server that answers every request 503 (each read
raises LookupFailed naming what it could not read, as when the API server is down).

A lookup that answers is the reconciler's `Snapshot.from_objects(objects)`, the one render
judges with: the tests build it from the objects they need, never a hand-written stand-in.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.fakeapi import FakeApiServer
from webhook.kube import KubeLookup


@contextmanager
def failing() -> Iterator[KubeLookup]:
    with FakeApiServer() as fake:
        fake.fail_status = 503
        lookup = KubeLookup(fake.api_client(retries=False), timeout=2.0)
        try:
            yield lookup
        finally:
            lookup.close()
