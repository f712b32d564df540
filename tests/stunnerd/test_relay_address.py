"""Where a listener binds when its relay address is not this host's (relay address discovery
hands stunnerd its Node's public address, which behind a cloud's 1:1 NAT is no address of the
node): the pod's own address ($STUNNER_ADDR) of the same family, else the family's wildcard;
its own address where it is this host's. (tests/reconciler/test_cds_node_address.py runs a
daemon on such a config end to end.)"""

from __future__ import annotations

import pytest

from stunnerd.transport.listener import _relay_note
from stunnerd.turn.sockets import local_bind_address

PUBLIC = "198.51.100.7"  # TEST-NET-2: no address of this host


@pytest.mark.parametrize(
    ("relay", "pod", "bound"),
    [
        ("127.0.0.1", "127.0.0.2", "127.0.0.1"),  # this host's: bound as it is
        (PUBLIC, "127.0.0.1", "127.0.0.1"),  # the pod's address
        (PUBLIC, None, "0.0.0.0"),  # no pod address: the wildcard
        (PUBLIC, "::1", "0.0.0.0"),  # the pod's address of another family: the wildcard
        (PUBLIC, "$STUNNER_ADDR", "0.0.0.0"),  # an unexpanded variable is no address
    ],
)
def test_the_bind_address_of_a_relay_address(relay: str, pod: str | None, bound: str) -> None:
    address, note = local_bind_address(relay, pod)
    assert address == bound
    assert (note == "") == (relay == bound)
    if note:
        assert note.strip() == f"not an address of this host: sockets bind {bound}"


def test_the_start_up_line_says_where_it_binds_and_when_the_address_is_private() -> None:
    _, note = local_bind_address(PUBLIC, "127.0.0.1")
    assert _relay_note(PUBLIC, note).startswith(
        " (not an address of this host: sockets bind 127.0.0.1"
    )
    assert _relay_note("10.244.1.7", "") == (
        " (a private address: only clients that reach its network can use it)"
    )
    assert _relay_note("127.0.0.1", "") == ""
