"""The reconciler's writes (`reconciler.apply.Write`), one request each: the API server's answer
goes straight into the cache (a second pass before the watch event arrives sees it). A refused
write (422, 403, anything) is returned with its status and error for the caller to log and retry
with back-off; a 409 re-reads the object into the cache first, and a DELETE of an object already
gone is done. A CREATE of an object a Gateway owns first asks the API server for that Gateway
(one GET): the cache can still hold a Gateway the garbage collector is already collecting for,
when the watch of Services or Deployments delivered the collector's deletion before the Gateway
watch delivered the Gateway's, and a create then would bring the object back for the collector
to delete again. Such a write is skipped (`WriteResult.skipped`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..apply import Verb, Write
from ..store import Cache, Object
from .api import Api, ApiException, describe


@dataclass
class WriteResult:
    write: Write
    ok: bool
    code: int = 0  # the API server's HTTP status of a refusal (0: no answer)
    error: str = ""
    previous: Object | None = None  # the cached object before the write
    skipped: str = ""  # why the write was not sent (its owner is gone); ok is then True


class Writer:
    """Sends writes one by one; every answer goes into the cache."""

    def __init__(self, api: Api, cache: Cache) -> None:
        self.api = api
        self.cache = cache

    def send(self, write: Write) -> WriteResult:
        previous = self.cache.get(write.api_version, write.kind, write.namespace, write.name)
        if write.verb == Verb.CREATE:
            gone = self._owner_gone(write)
            if gone:
                return WriteResult(write, True, previous=previous, skipped=gone)
        try:
            stored = self.api.write(write)
        except ApiException as exc:
            if exc.status == 409 or (exc.status == 404 and write.verb == Verb.DELETE):
                self._reread(write)
            if exc.status == 404 and write.verb == Verb.DELETE:
                return WriteResult(write, True, previous=previous)
            return WriteResult(write, False, int(exc.status or 0), describe(exc), previous)
        except Exception as exc:  # no answer (connection refused, timeout)
            return WriteResult(write, False, 0, describe(exc), previous)
        if stored is None:
            self.cache.remove(
                None,
                {
                    "apiVersion": write.api_version,
                    "kind": write.kind,
                    "metadata": {"namespace": write.namespace, "name": write.name},
                },
            )
        else:
            self.cache.put(None, stored)
        return WriteResult(write, True, previous=previous)

    def _owner_gone(self, write: Write) -> str:
        """Which Gateway owning the object to be created the API server no longer has (or has
        with another uid), "" if none. An answer other than 404 counts as present: the create
        then meets the same API server and is refused or retried as any write."""
        metadata = (write.body or {}).get("metadata") or {}
        for reference in metadata.get("ownerReferences") or []:
            if reference.get("kind") != "Gateway":
                continue
            name = str(reference.get("name"))
            try:
                owner = self.api.get(
                    str(reference.get("apiVersion")), "Gateway", write.namespace, name
                )
            except ApiException as exc:
                if exc.status == 404:
                    return f"Gateway {write.namespace}/{name} is gone"
                continue
            except Exception:
                continue
            if (owner.get("metadata") or {}).get("uid") != reference.get("uid"):
                return f"Gateway {write.namespace}/{name} is another one now"
        return ""

    def _reread(self, write: Write) -> None:
        """After a conflict: the object as it is now, into the cache (or out of it)."""
        try:
            fresh = self.api.get(write.api_version, write.kind, write.namespace, write.name)
        except ApiException as exc:
            if exc.status == 404:
                self.cache.remove(
                    None,
                    {
                        "apiVersion": write.api_version,
                        "kind": write.kind,
                        "metadata": {"namespace": write.namespace, "name": write.name},
                    },
                )
            return
        except Exception:
            return
        self.cache.put(None, fresh)
