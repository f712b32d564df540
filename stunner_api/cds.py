"""The config discovery service (CDS) protocol: its paths, parameters, timings and config ids.

The reconciler serves it and stunnerd (and the auth service) speak it (ANCHORS §1.12):

- `GET /api/v1/configs`: a `ConfigList` `{"version": "v1", "items": [config, ...]}`;
- `GET /api/v1/configs/{namespace}`: the same for one namespace;
- `GET /api/v1/configs/{namespace}/{name}`: one `StunnerConfig`, or 404 `{"code", "message"}`;
- any of these with `?watch=true` upgrades to a WebSocket: text frames, each one full config (the
  current ones on connect, then every change; a deleted Gateway is sent as the zero config named
  by its id);
- on a watch of one config, the usage frames of cluster-wide user quotas (below): a stunnerd
  reports its allocation counts per user, and the CDS answers it with the other pods' sums.

A config id is `<namespace>/<name>` of the Gateway, which is also the config's `admin.name`.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from .vocabulary import CDS_TOKEN_FILE_ENV, NODE_ADDRESS_PLACEHOLDER

DEFAULT_PORT = 13478
DEFAULT_ADDRESS = f":{DEFAULT_PORT}"
CONFIGS_PATH = "/api/v1/configs"
NAMESPACE_PATH = CONFIGS_PATH + "/{namespace}"
CONFIG_PATH = CONFIGS_PATH + "/{namespace}/{name}"
LICENSE_PATH = "/api/v1/license"
# Ours: the Nodes' public addresses for relay address discovery, `{"version": "v1", "nodes":
# {name: address}}`, which the auth service (and `stunner ice`) turn into one URI per node.
NODES_PATH = "/api/v1/nodes"
WATCH_PARAM = "watch"
NODE_PARAM = "node"
LIST_VERSION = "v1"

# WebSocket keepalive (Go's pkg/config/client): the client pings every PING_PERIOD seconds and
# gives up after PONG_WAIT seconds without an answer; a write may take WRITE_TIMEOUT seconds; a
# lost connection is retried every RETRY_PERIOD seconds. The server answers pings with
# PONG_PAYLOAD.
PING_PERIOD = 5.0
PONG_WAIT = 8.0
WRITE_TIMEOUT = 2.0
# How long a connection attempt may take, TCP and WebSocket handshake together. A CDS answers in
# milliseconds; during a reconciler rollout the first attempt after a replica ends can reach an
# endpoint that never answers, and waiting PONG_WAIT for it left a stunnerd on a stale config for
# ~10 s on a real node (issue 19's cluster run); past this the next attempt is a retry away.
OPEN_TIMEOUT = 2.0
RETRY_PERIOD = 1.0
PONG_PAYLOAD = b"keepalive"

ID_SEPARATOR = "/"

# Relay address discovery (Go's node patcher): a stunnerd names its Node (`?node=`, from
# STUNNER_NODENAME) and the CDS replaces every listener `address` that is the placeholder with
# that Node's public address, else with the pod's own (`$STUNNER_ADDR`, which stunnerd expands).
NODE_ENV = "STUNNER_NODENAME"
POD_ADDRESS = "$STUNNER_ADDR"
_PLACEHOLDER_FIELD = f'"address":"{NODE_ADDRESS_PLACEHOLDER}"'


def has_node_placeholder(text: str) -> bool:
    """Whether a config (Go's JSON, `StunnerConfig.to_json`) has a listener to patch."""
    return _PLACEHOLDER_FIELD in text


def patch_node_address(text: str, address: str) -> str:
    """A config's JSON with every listener `address` that is the node placeholder replaced by
    `address`. Exact on Go's compact JSON: a string value cannot hold the unescaped quotes the
    pattern has, so only an `address` key's own value matches."""
    return text.replace(_PLACEHOLDER_FIELD, f'"address":{json.dumps(address)}')


class InvalidId(ValueError):
    """A config id that is not `<namespace>/<name>`."""


def config_id(namespace: str, name: str) -> str:
    """The CDS id of the Gateway `namespace/name`."""
    return f"{namespace}{ID_SEPARATOR}{name}"


def split_id(id: str) -> tuple[str, str]:
    """(namespace, name) of a config id; `InvalidId` unless exactly two non-empty parts."""
    namespace, sep, name = id.partition(ID_SEPARATOR)
    if not sep or not namespace or not name or ID_SEPARATOR in name:
        raise InvalidId(f"invalid id {id!r}: want <namespace>/<name>")
    return namespace, name


def config_path(namespace: str, name: str) -> str:
    """The URL path of one config, its parts percent-encoded."""
    return CONFIG_PATH.format(
        namespace=urllib.parse.quote(namespace, safe=""),
        name=urllib.parse.quote(name, safe=""),
    )


def listener_parts(listener_name: str) -> tuple[str, str, str] | None:
    """(namespace, gateway, listener) of a rendered listener name `<ns>/<gw>/<listener>`, else
    None (a hand-written config's listener)."""
    parts = listener_name.split(ID_SEPARATOR)
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def token_file(env: Mapping[str, str] | None = None) -> Path | None:
    """The CDS token file STUNNER_CDS_TOKEN_FILE names in `env` (default: the process's)."""
    name = (os.environ if env is None else env).get(CDS_TOKEN_FILE_ENV)
    return Path(name) if name else None


def bearer_headers(path: Path) -> dict[str, str]:
    """`Authorization: Bearer <token>` with the file's content read now (the kubelet rotates
    it); {} for an empty file. Raises OSError or UnicodeDecodeError when it cannot be read."""
    token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


# --- cluster-wide user quotas (README "Cluster-wide user quotas") ------------------------------
# A stunnerd whose config has `admin.user_quota` > 0 sends, on its watch of one config, a usage
# report text frame: its live allocation count per user id (the whole table, non-zero counts
# only), on every (re)connect and when the counts change, at most every REPORT_INTERVAL
# seconds. The CDS answers a watcher that has reported (and only one that has: a Go stunnerd,
# which sends nothing, gets configs only) with the sum of the OTHER reporting pods' counts per
# user of that config, whenever it changes (at most every REPORT_INTERVAL seconds per config).
# Both frames are JSON objects with one key no StunnerConfig has. Each is bounded: at most
# MAX_USAGE_USERS users and MAX_USAGE_BYTES bytes, each count at most MAX_USAGE_COUNT; past that
# the users with the fewest allocations are left out (counted on their own pod only).
USAGE_REPORT_KEY = "quotaUsageReport"  # stunnerd -> CDS: this pod's counts
USAGE_OTHERS_KEY = "quotaUsageOthers"  # CDS -> stunnerd: the other pods' counts, summed
REPORT_INTERVAL = 0.2
MAX_USAGE_USERS = 1024
MAX_USAGE_BYTES = 16 * 1024
MAX_USAGE_COUNT = (1 << 31) - 1


class UsageError(ValueError):
    """A usage frame that is not `{key: {user id: count > 0, ...}}` within the bounds."""


def usage_entry(user: str, count: int) -> str:
    """One user's `"user":count` of a usage frame (`usage_frame`)."""
    return f"{json.dumps(user)}:{count}"


def usage_frame(key: str, entries: Iterable[str]) -> tuple[str, int]:
    """(the frame `{key: {...}}` of `entries` (`usage_entry`, in the order given) as far as they
    fit the bounds, how many went in)."""
    parts: list[str] = []
    size = len(key) + 8  # {"key":{}}
    for part in entries:
        if len(parts) == MAX_USAGE_USERS or size + len(part) + 1 > MAX_USAGE_BYTES:
            break
        parts.append(part)
        size += len(part) + 1
    return usage_text(key, ",".join(parts)), len(parts)


def usage_fits(key: str, users: int, body: str) -> bool:
    """Whether `users` entries joined into `body` make a frame within the bounds."""
    return users <= MAX_USAGE_USERS and len(key) + 8 + len(body) <= MAX_USAGE_BYTES


def usage_text(key: str, body: str) -> str:
    """The frame `{key: {body}}` of entries already joined (`usage_fits` says if it may go)."""
    return f'{{"{key}":{{{body}}}}}'


def encode_usage(
    key: str, counts: Mapping[str, int], first: Collection[str] = ()
) -> tuple[str, int]:
    """(the frame `{key: {user: count}}`, how many users were left out to fit the bounds). The
    users in `first` come first (those the receiving pod holds: the ones it may admit again),
    then those with the most allocations: they are the ones nearest their quota."""
    ranked = sorted(
        ((n, u) for u, n in counts.items() if n > 0), key=lambda e: (e[1] not in first, -e[0], e[1])
    )
    text, taken = usage_frame(key, (usage_entry(u, n) for n, u in ranked))
    return text, len(ranked) - taken


def usage_key(text: str | bytes) -> str | None:
    """USAGE_REPORT_KEY or USAGE_OTHERS_KEY if `text` is such a frame (by its first key, cheap:
    a config's JSON starts with another), else None."""
    head = text[:64] if isinstance(text, str) else text[:64].decode("utf-8", "replace")
    head = head.lstrip()
    for key in (USAGE_REPORT_KEY, USAGE_OTHERS_KEY):
        if head.startswith(f'{{"{key}"'):
            return key
    return None


def frame_body(
    text: str | bytes, key: str, limit: int, error: type[ValueError], what: str, shape: str
) -> dict[str, Any]:
    """The object under `key` of a frame on the CDS watch that is `{key: {...}}` alone, at most
    `limit` bytes (plus 1 KiB of envelope); `error` says what is wrong, naming the frame `what`
    and its `shape`. The usage frames and the sessions frames share it."""
    if len(text) > limit + 1024:
        raise error(f"{what} frame of {len(text)} bytes, more than {limit}")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{what} frame is not JSON: {exc}") from None
    if not isinstance(data, dict) or list(data) != [key] or not isinstance(data[key], dict):
        raise error(f'{what} frame is not {{"{key}": {shape}}}')
    body: dict[str, Any] = data[key]
    return body


def parse_usage(text: str | bytes, key: str) -> dict[str, int]:
    """The counts of a usage frame `{key: {user id: count}}`; UsageError says what is wrong."""
    counts: dict[str, int] = frame_body(
        text, key, MAX_USAGE_BYTES, UsageError, "usage", "{user: count}"
    )
    if len(counts) > MAX_USAGE_USERS:
        raise UsageError(f"usage frame of {len(counts)} users, more than {MAX_USAGE_USERS}")
    for count in counts.values():
        if type(count) is not int or not 0 < count <= MAX_USAGE_COUNT:
            raise UsageError(f"usage frame count {count!r} is not a positive integer")
    return counts
