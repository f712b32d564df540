"""Leader election (`LeaseElector`): a `coordination.k8s.io/v1` Lease with client-go's semantics
(acquire when absent, released or not renewed for `lease_duration` by our clock; renew every
`retry_period`; give up leading when no renewal succeeded for `renew_deadline`; release on
shutdown by clearing the holder). The pinned client's `leaderelection` package has a LeaseLock,
but its `LeaderElection` runs endless loops with no stop and no release-on-cancel, exits the
process on a configuration error and needs retry periods of at least a second: so the loop is
ours, the Lease fields and their meaning are client-go's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from datetime import UTC, datetime
from typing import Any

from stunner_api.vocabulary import DEPLOYMENT, LEASE

from .api import Api, ApiException, describe, resource_path

log = logging.getLogger("stunner.kube")

LEASE_DURATION = 15.0  # client-go / controller-runtime defaults
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
LEADER_ELECTION_ID = "92062b70.l7mp.io"  # Go STUNner's lease name


def _micro_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{os.uname().nodename}_{os.getpid()}_{random.getrandbits(32):08x}"


class LeaseElector:
    """Leader election with a coordination.k8s.io/v1 Lease. `leading` says whether this replica
    may write; `changed` is set on every change of it."""

    def __init__(
        self,
        api: Api,
        namespace: str,
        name: str = LEADER_ELECTION_ID,
        identity: str | None = None,
        *,
        lease_duration: float = LEASE_DURATION,
        renew_deadline: float = RENEW_DEADLINE,
        retry_period: float = RETRY_PERIOD,
        owner: str = "",
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease duration")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.leading = False
        self.changed = asyncio.Event()
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._last_renewal = 0.0
        self._stopped = False
        self._round: asyncio.Future[bool] | None = None  # the round in flight (a thread)
        # The Deployment (in the Lease's namespace) the Lease is owned by, so that deleting it
        # (`helm uninstall`) deletes the Lease: the replica cannot release it then, its
        # ServiceAccount being deleted with it, and a Lease left behind would keep the next
        # install's reconciler from leading for a lease duration.
        self.owner = owner
        self._owner_reference: dict[str, Any] | None = None
        self._owner_warned = False

    @property
    def path(self) -> str:
        return resource_path(LEASE, "v1", self.namespace, self.name)

    def _set_leading(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.info(
                "%s leadership of Lease %s/%s (%s)",
                "acquired" if leading else "lost",
                self.namespace,
                self.name,
                self.identity,
            )
            self.changed.set()

    def _spec(self, acquire: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": acquire,
            "renewTime": _micro_time(datetime.now(UTC)),
            "leaseTransitions": transitions,
        }

    def owner_reference(self) -> dict[str, Any] | None:
        """The ownerReference to the `owner` Deployment, looked up once (None without an owner,
        or while it cannot be read: the Lease is written without one then)."""
        if not self.owner:
            return None
        if self._owner_reference is None:
            try:
                deployment = self.api.request(
                    "GET", resource_path(DEPLOYMENT, "v1", self.namespace, self.owner)
                )
            except ApiException as exc:
                if not self._owner_warned:  # said once; tried again at every write
                    self._owner_warned = True
                    log.warning(
                        "the Lease's owner, Deployment %s/%s: %s",
                        self.namespace,
                        self.owner,
                        describe(exc),
                    )
                return None
            self._owner_reference = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": self.owner,
                "uid": deployment["metadata"]["uid"],
            }
        return self._owner_reference

    def _owned(self, metadata: dict[str, Any]) -> None:
        """`metadata` with our owner's reference (replacing one to an older Deployment of the
        same name: a reinstall's Lease whose owner is gone)."""
        reference = self.owner_reference()
        if reference is None:
            return
        references = [
            r
            for r in metadata.get("ownerReferences") or []
            if not (r.get("kind") == "Deployment" and r.get("name") == self.owner)
        ]
        metadata["ownerReferences"] = [*references, reference]

    def try_acquire_or_renew(self) -> bool:
        """One round (blocking): True if we hold the Lease afterwards."""
        now = time.monotonic()
        try:
            lease = self.api.request("GET", self.path)
        except ApiException as exc:
            if exc.status != 404:
                raise
            metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
            self._owned(metadata)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": metadata,
                "spec": self._spec(_micro_time(datetime.now(UTC)), 0),
            }
            self.api.request("POST", resource_path(LEASE, "v1", self.namespace), body=body)
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        observed = (holder, str(spec.get("renewTime") or ""))
        if observed != self._observed:
            self._observed, self._observed_at = observed, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and now < self._observed_at + duration:
            return False  # held by another, renewed within its lease duration (our clock)
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            acquire = str(spec.get("acquireTime") or _micro_time(datetime.now(UTC)))
        else:
            acquire, transitions = _micro_time(datetime.now(UTC)), transitions + 1
        lease["spec"] = self._spec(acquire, transitions)
        self._owned(lease.setdefault("metadata", {}))
        self.api.request("PUT", self.path, body=lease)  # 409 if another got there first
        return True

    def release(self, attempts: int = 3) -> None:
        """Give the Lease up (blocking): the holder cleared, so another replica takes it now.
        A conflict (the Lease written between our read and our write) is read again."""
        for attempt in range(attempts):
            try:
                lease = self.api.request("GET", self.path)
                if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                    return
                now = _micro_time(datetime.now(UTC))
                lease["spec"].update(
                    {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now}
                )
                self.api.request("PUT", self.path, body=lease)
                log.info("released Lease %s/%s", self.namespace, self.name)
                return
            except ApiException as exc:
                if exc.status == 409 and attempt + 1 < attempts:
                    continue
                failure = describe(exc)
            except Exception as exc:
                failure = str(exc)
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, failure)
            return

    async def run(self) -> None:
        """Acquire and renew until stopped or cancelled (leadership is dropped then, and the
        Lease released only by `stop`)."""
        try:
            while not self._stopped:
                self._round = asyncio.ensure_future(asyncio.to_thread(self.try_acquire_or_renew))
                try:
                    held = await asyncio.shield(self._round)
                except Exception as exc:
                    log.debug("leader election round failed: %s", describe(exc))
                    held = False
                if self._stopped:
                    break
                now = time.monotonic()
                if held:
                    self._last_renewal = now
                    self._set_leading(True)
                elif self.leading and now - self._last_renewal > self.renew_deadline:
                    self._set_leading(False)
                elif self.leading and self._observed and self._observed[0] != self.identity:
                    self._set_leading(False)
                await asyncio.sleep(self.retry_period * random.uniform(1.0, 1.2))
        finally:
            self._set_leading(False)

    async def stop(self, release: bool = True) -> None:
        """No more rounds; give the Lease up if we held it and `release`."""
        self._stopped = True
        was_leading = self.leading
        self._set_leading(False)
        if self._round is not None:
            # A renewal in flight writes the Lease after it read it: released before that
            # write lands, the release would conflict with it (409) and the Lease stay ours.
            await asyncio.gather(self._round, return_exceptions=True)
        if release and was_leading:
            await asyncio.to_thread(self.release)
