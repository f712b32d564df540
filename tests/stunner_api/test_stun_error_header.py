"""stunner_api.stun's answer to a request the parser would not take: built from its 20-byte
header alone, echoing its method (known or not) and transaction id with ERROR-CODE only."""

from __future__ import annotations

import os

from stunner_api import stun
from stunner_api.stun import Class, Message, Method


def test_the_error_answer_echoes_an_unknown_method_and_parses_back() -> None:
    transaction_id = os.urandom(12)
    request = Message(Method.ALLOCATE, Class.REQUEST, transaction_id=transaction_id).encode()
    header = bytearray(request[:20])
    header[0:2] = (0x0ABC & 0x3EEF).to_bytes(2, "big")  # a method no table knows, a request
    unknown = stun.method_bits(header)
    answer = stun.error_to_header(bytes(header), 400, "Bad Request: unknown method")
    assert stun.method_bits(answer) == unknown
    assert answer[8:20] == transaction_id
    assert (int.from_bytes(answer[:2], "big") & 0x0110) == Class.ERROR
    assert len(answer) - 20 == int.from_bytes(answer[2:4], "big") and len(answer) % 4 == 0


def test_the_error_answer_to_a_known_method_is_a_well_formed_stun_error() -> None:
    for reason in ("", "x", "Forbidden: STUN only"):  # every padding length
        request = Message(Method.BINDING, Class.REQUEST).encode()
        parsed = stun.parse_message(stun.error_to_header(request[:20], 403, reason))
        assert (parsed.method, parsed.message_class) == (Method.BINDING, Class.ERROR)
        assert parsed.attributes["ERROR-CODE"] == (403, reason)
        assert parsed.transaction_id == request[8:20]
