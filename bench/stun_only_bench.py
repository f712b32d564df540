"""What one request costs stunnerd's TURN server, STUN-only (auth type none) against static auth.

In-process, no sockets: `TurnServer.handle` of one listener is called N times per message shape
with a Downstream whose send does nothing, and the CPU time per call is printed (the median of
--repeat runs). The error-answer limits are off (0), as a flood from many addresses would meet them.

    .venv/bin/python bench/stun_only_bench.py [--count 20000] [--repeat 5]

Shapes: a Binding request; an unsigned Allocate (static: 401 with a fresh nonce; STUN-only:
403 from the header); a signed Refresh with a nonce the server never issued (static: parsed,
the nonce's HMAC checked, 438 with a new nonce; STUN-only: 403 from the header); a Send
indication from a client without allocation (dropped either way).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable

from stunner_api.stun import Class, Message, Method
from stunnerd.turn.allocation import Downstream
from stunnerd.turn.auth import Authenticator, long_term_key
from stunnerd.turn.limits import Limits
from stunnerd.turn.router import Router
from stunnerd.turn.server import ServerContext, TurnServer

REALM = "stunner.l7mp.io"
CLIENT = ("192.0.2.1", 40000)


def shapes() -> dict[str, bytes]:
    binding = Message(Method.BINDING, Class.REQUEST).encode()
    allocate = Message(Method.ALLOCATE, Class.REQUEST)
    allocate.attributes["REQUESTED-TRANSPORT"] = 17
    refresh = Message(Method.REFRESH, Class.REQUEST)
    refresh.attributes.update(
        {"LIFETIME": 600, "USERNAME": "user", "REALM": REALM, "NONCE": "0" * 48}
    )
    send = Message(Method.SEND, Class.INDICATION)
    send.attributes.update({"XOR-PEER-ADDRESS": ("192.0.2.9", 9), "DATA": b"x" * 160})
    return {
        "Binding request": binding,
        "Allocate, unsigned": allocate.encode(),
        "Refresh, signed, unknown nonce": refresh.encode(
            integrity_key=long_term_key("user", REALM, "pass")
        ),
        "Send indication, no allocation": send.encode(),
    }


def server(auth_type: str) -> TurnServer:
    credentials = {"username": "user", "password": "pass"} if auth_type == "static" else {}
    limits = Limits(error_rate=0, error_rate_total=0)  # 0: no limit
    context = ServerContext(Authenticator(auth_type, REALM, credentials), Router(), limits=limits)
    return TurnServer("bench/gw/udp", "127.0.0.1", context)


def per_call(call: Callable[[], None], count: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(count):
            call()
        runs.append((time.process_time() - start) / count)
    return statistics.median(runs)


async def main(count: int, repeat: int) -> None:
    downstream = Downstream(CLIENT, lambda data: None, stream=False)
    servers = {mode: server(mode) for mode in ("static", "none")}
    lines = ["| message | static auth, us | STUN-only (none), us |", "|---|---|---|"]
    for name, data in shapes().items():
        figures = []
        for turn in servers.values():

            def call(turn: TurnServer = turn, data: bytes = data) -> None:
                turn._responses.clear()  # every call a new transaction, not a retransmission
                turn.handle(data, downstream)

            figures.append(per_call(call, count, repeat) * 1e6)
        lines.append(f"| {name} | {figures[0]:.2f} | {figures[1]:.2f} |")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.count, args.repeat))
