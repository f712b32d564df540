"""Property test: no input, however malformed, escapes a live listener as an exception.

Hypothesis feeds arbitrary bytes and mutated valid messages to a running TURN-UDP listener and
straight into `TurnServer.handle`; after every batch a Binding request must still be answered.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stunner_api import stun
from stunner_api.stun import Class, Message, Method
from stunnerd.turn.allocation import Downstream
from tests.support.turnclient import HOST, RawClient, free_port, make_config, running_stunner

VALID = [
    Message(Method.BINDING, Class.REQUEST).encode(),
    Message(Method.ALLOCATE, Class.REQUEST, attributes={"REQUESTED-TRANSPORT": 17}).encode(),
    stun.pack_channel_data(0x4000, b"payload"),
]


def mutations() -> st.SearchStrategy[bytes]:
    def mutate(base: bytes, flips: list[tuple[int, int]], cut: int) -> bytes:
        data = bytearray(base)
        for position, value in flips:
            data[position % len(data)] ^= value
        return bytes(data[: max(0, len(data) - cut)])

    return st.builds(
        mutate,
        st.sampled_from(VALID),
        st.lists(st.tuples(st.integers(0, 200), st.integers(1, 255)), max_size=4),
        st.integers(0, 8),
    )


packets = st.one_of(st.binary(max_size=300), mutations())


@settings(max_examples=300, deadline=None)
@given(st.lists(packets, min_size=1, max_size=10))
def test_turn_server_handle_never_raises(batch: list[bytes]) -> None:
    async def scenario() -> None:
        port = free_port()
        async with running_stunner(
            make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))
        ) as stunner:
            server = stunner.listeners["testns/gw/turn-udp"].server
            sent: list[bytes] = []
            downstream = Downstream(("127.0.0.1", 40000), sent.append, stream=False)
            for data in batch:
                if data and (data[0] & 0xC0) == 0x40:
                    server.handle_channel_data(data, downstream.remote)
                else:
                    server.handle(data, downstream)
            await asyncio.sleep(0)
            for answer in sent:  # whatever we answered parses (a 400 echoes an unknown method)
                try:
                    assert stun.parse_message(answer).message_class in (Class.SUCCESS, Class.ERROR)
                except stun.UnknownMethodError as unknown:
                    assert unknown.message_class == Class.ERROR

    asyncio.run(scenario())


@pytest.mark.parametrize("seed", [1, 2])
def test_live_listener_keeps_serving_after_fuzz(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    import random

    rng = random.Random(seed)

    async def scenario() -> None:
        port = free_port()
        async with running_stunner(make_config(port, [f"{HOST}/32"], protocols=("TURN-UDP",))):
            client = await RawClient.connect((HOST, port))
            await client.allocate()
            for _ in range(500):
                base = bytearray(rng.choice(VALID))
                for _ in range(rng.randint(0, 3)):
                    base[rng.randrange(len(base))] ^= rng.randrange(1, 256)
                client.send_raw(bytes(base[: rng.randint(0, len(base))]))
            response = await client.request(Message(Method.BINDING, Class.REQUEST), sign=False)
            assert response.message_class == Class.SUCCESS
            assert (await client.refresh(600)).message_class == Class.SUCCESS
            client.close()

    with caplog.at_level(logging.ERROR, logger="stunner"):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
