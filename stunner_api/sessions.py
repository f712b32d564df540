"""Sessions: the live allocations of a Gateway's stunnerd pods, listed and ended through the CDS
(README "Sessions: list and end allocations"; issue 29).

Every stunnerd holds an authenticated watch on the CDS (stunner_api.cds). Besides configs and
the usage frames of cluster-wide user quotas, the watch of one config carries these frames, each
a JSON object whose one key no StunnerConfig (nor a usage frame) has:

- CDS -> stunnerd `{"sessionsRequest": {"request": R}}`: list your allocations;
- CDS -> stunnerd `{"sessionsEnd": {"request": R, "users": [...], "allocations": [...]}}`:
  end the allocations of these user ids and these allocation ids, now;
- stunnerd -> CDS `{"sessionsReport": {"request": R, "pod": P, "sessions": [...], "omitted": N}}`:
  the answer to either (for an end: the allocations it ended), at most MAX_SESSIONS_BYTES.

A session (`session_record`) names its allocation by an id stunnerd draws at random when it
makes it, the pod, listener, transport, client and relay addresses, the user id (never the
username with its timestamp, never a password), peers (the IPs with a permission) and channels,
its age and remaining lifetime in seconds, and its packets and bytes each way where the relay
path counts them per allocation (null where it does not: the native engine and the kernel
offload count per listener).

The CDS serves them to the CLI (its readers only, reconciler.cds.access):
`GET SESSIONS_PATH` lists every pod's sessions of a Gateway, `POST DISCONNECT_PATH?user=U` (or
`?allocation=ID`) ends them on every pod and answers what ended.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .cds import frame_body

SESSIONS_PATH = "/api/v1/sessions/{namespace}/{name}"
DISCONNECT_PATH = SESSIONS_PATH + "/disconnect"
USER_PARAM = "user"
ALLOCATION_PARAM = "allocation"

REQUEST_KEY = "sessionsRequest"  # CDS -> stunnerd: list
END_KEY = "sessionsEnd"  # CDS -> stunnerd: end these
REPORT_KEY = "sessionsReport"  # stunnerd -> CDS: the answer to either
# The request id of the empty report a stunnerd sends on each connection: it answers sessions
# requests, as this pod (a Go stunnerd sends none, and is never asked).
HELLO = "hello"
KEYS = (REQUEST_KEY, END_KEY, REPORT_KEY)

# A pod's report is at most this long (about a thousand sessions); past it the newest are left
# out and counted in `omitted`. The CDS takes watch frames up to this size from a pod's token.
MAX_SESSIONS_BYTES = 256 * 1024
MAX_SELECTORS = 256  # user ids or allocation ids in one end command
MAX_REQUEST_ID = 64
ANSWER_TIMEOUT = 0.8  # seconds the CDS waits for the pods' answers (an end: within 1 s)

# The columns of `stunner sessions` (and the keys of a session, in this order).
FIELDS = (
    "id",
    "pod",
    "listener",
    "transport",
    "client",
    "user",
    "relay",
    "peers",
    "channels",
    "age",
    "lifetime",
    "rxPackets",
    "rxBytes",
    "txPackets",
    "txBytes",
)
COUNTERS = ("rxPackets", "rxBytes", "txPackets", "txBytes")
# Keys a session may lack: a stunnerd of an earlier release, still draining during an upgrade,
# reports without them, and its sessions are shown with null there. `bandwidthLimit`: the
# allocation's cap in bits per second each way (auth.allocation_bandwidth_limit), null: none.
OPTIONAL_FIELDS = ("bandwidthLimit",)


class SessionsError(ValueError):
    """A sessions frame that is not what its key says (the message says what is wrong)."""


def frame_key(text: str | bytes) -> str | None:
    """REQUEST_KEY, END_KEY or REPORT_KEY when `text` is such a frame (by its first key, as
    stunner_api.cds.usage_key: cheap), else None."""
    head = text[:64] if isinstance(text, str) else text[:64].decode("utf-8", "replace")
    head = head.lstrip()
    for key in KEYS:
        if head.startswith(f'{{"{key}"'):
            return key
    return None


def session_record(
    *,
    id: str,
    listener: str,
    transport: str,
    client: str,
    user: str,
    relay: str,
    peers: Iterable[str],
    channels: Mapping[int, str],
    age: float,
    lifetime: float,
    counters: Sequence[int] | None,
    pod: str = "",
    bandwidth_limit: int | None = None,
) -> dict[str, Any]:
    """One allocation as `stunner sessions` shows it (FIELDS, OPTIONAL_FIELDS); `counters`: rx
    packets, rx bytes, tx packets, tx bytes (rx: from the client), None where the relay path does
    not count them per allocation; `bandwidth_limit`: its cap (bits per second), None: none."""
    record: dict[str, Any] = {
        "id": id,
        "pod": pod,
        "listener": listener,
        "transport": transport,
        "client": client,
        "user": user,
        "relay": relay,
        "peers": sorted(peers),
        "channels": {str(number): peer for number, peer in sorted(channels.items())},
        "age": round(age, 1),
        "lifetime": round(max(0.0, lifetime), 1),
    }
    for key, value in zip(COUNTERS, counters or (None,) * 4, strict=True):
        record[key] = value
    record["bandwidthLimit"] = bandwidth_limit or None
    return record


def request_frame(request: str) -> str:
    return json.dumps({REQUEST_KEY: {"request": request}}, separators=(",", ":"))


def end_frame(request: str, users: Iterable[str], allocations: Iterable[str]) -> str:
    body = {"request": request, "users": sorted(users), "allocations": sorted(allocations)}
    return json.dumps({END_KEY: body}, separators=(",", ":"))


def report_frame(request: str, pod: str, sessions: Sequence[Mapping[str, Any]]) -> str:
    """The report of `sessions` (oldest first kept), within MAX_SESSIONS_BYTES."""
    parts: list[str] = []
    size = 200 + len(request) + len(pod)
    for session in sorted(sessions, key=lambda s: -float(s.get("age", 0))):
        part = json.dumps(session, separators=(",", ":"))
        if size + len(part) + 1 > MAX_SESSIONS_BYTES:
            break
        parts.append(part)
        size += len(part) + 1
    head = json.dumps({"request": request, "pod": pod, "omitted": len(sessions) - len(parts)})
    return f'{{"{REPORT_KEY}":{head[:-1]},"sessions":[{",".join(parts)}]}}}}'


_REQUIRED = frozenset(FIELDS)
_KNOWN = _REQUIRED | frozenset(OPTIONAL_FIELDS)


def _body(text: str | bytes, key: str) -> dict[str, Any]:
    body = frame_body(text, key, MAX_SESSIONS_BYTES, SessionsError, "sessions", "{...}")
    request = body.get("request")
    if not isinstance(request, str) or not 0 < len(request) <= MAX_REQUEST_ID:
        raise SessionsError("sessions frame without a request id")
    return body


def parse_request(text: str | bytes) -> str:
    """The request id of a REQUEST_KEY frame."""
    return str(_body(text, REQUEST_KEY)["request"])


def parse_end(text: str | bytes) -> tuple[str, frozenset[str], frozenset[str]]:
    """(request id, user ids, allocation ids) of an END_KEY frame."""
    body = _body(text, END_KEY)
    out: list[frozenset[str]] = []
    for field in ("users", "allocations"):
        values = body.get(field, [])
        if (
            not isinstance(values, list)
            or len(values) > MAX_SELECTORS
            or not all(isinstance(v, str) and v for v in values)
        ):
            raise SessionsError(f"sessions end frame: {field} is not a list of names")
        out.append(frozenset(values))
    return str(body["request"]), out[0], out[1]


def parse_report(text: str | bytes) -> tuple[str, str, list[dict[str, Any]], int]:
    """(request id, pod, sessions, omitted) of a REPORT_KEY frame; each session has FIELDS and
    may have OPTIONAL_FIELDS, nothing else (the pod's own name filled in; a missing optional
    field is filled in as null)."""
    body = _body(text, REPORT_KEY)
    pod, sessions, omitted = body.get("pod"), body.get("sessions"), body.get("omitted", 0)
    if not isinstance(pod, str) or not isinstance(sessions, list) or type(omitted) is not int:
        raise SessionsError("sessions report is not {request, pod, sessions, omitted}")
    for session in sessions:
        if not isinstance(session, dict) or not _KNOWN >= set(session) >= _REQUIRED:
            raise SessionsError("sessions report: a session without exactly the known fields")
        for key in OPTIONAL_FIELDS:
            session.setdefault(key, None)
        limit = session["bandwidthLimit"]
        if limit is not None and (type(limit) is not int or limit <= 0):
            raise SessionsError("sessions report: a bandwidthLimit that is not a positive integer")
    return str(body["request"]), pod, sessions, omitted
