"""A listener's relay addresses (stunnerd.turn.relay_addresses): the families it offers, the
address told in each, where its relay sockets bind, and the sockets, on real loopback sockets."""

from __future__ import annotations

import socket

import pytest

from stunner_api.stun import FAMILY_IPV4, FAMILY_IPV6
from stunnerd.turn.relay_addresses import NoRelaySocket, RelayAddresses


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_a_loopback_listener_offers_what_the_choice_says_and_tells_each_familys_loopback() -> None:
    addresses = RelayAddresses("127.0.0.1", "127.0.0.1")
    assert addresses.offered("") == (FAMILY_IPV4,)
    assert addresses.offered("IPv4") == (FAMILY_IPV4,)
    assert addresses.offered("DualStack") == (FAMILY_IPV4, FAMILY_IPV6)
    assert addresses.told(FAMILY_IPV4) == "127.0.0.1"
    assert addresses.told(FAMILY_IPV6) == "::1"
    assert addresses.bind_address(FAMILY_IPV6) == "::1"


def test_behind_nat_the_relay_address_is_told_and_the_local_one_bound() -> None:
    addresses = RelayAddresses("203.0.113.7", "127.0.0.1")  # a node's public address, 1:1 NAT
    sock, following = addresses.udp_socket(FAMILY_IPV4, None)
    with sock:
        assert following is None
        assert sock.getsockname()[0] == "127.0.0.1"
        assert not sock.getblocking()
    assert addresses.told(FAMILY_IPV4) == "203.0.113.7"


def test_an_even_port_with_the_next_one_reserved() -> None:
    addresses = RelayAddresses("127.0.0.1", "127.0.0.1")
    sock, following = addresses.udp_socket(FAMILY_IPV4, True)
    assert following is not None
    with sock, following:
        port = sock.getsockname()[1]
        assert port % 2 == 0
        assert following.getsockname() == ("127.0.0.1", port + 1)
    sock, following = addresses.udp_socket(FAMILY_IPV4, False)  # even, nothing reserved
    with sock:
        assert following is None and sock.getsockname()[1] % 2 == 0


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_the_other_familys_socket_binds_that_familys_address() -> None:
    sock, _ = RelayAddresses("127.0.0.1", "127.0.0.1").udp_socket(FAMILY_IPV6, None)
    with sock:
        assert sock.family == socket.AF_INET6 and sock.getsockname()[0] == "::1"


def test_an_address_that_cannot_be_bound_is_no_relay_socket() -> None:
    addresses = RelayAddresses("192.0.2.1", "192.0.2.1")  # not this host's: nothing binds it
    with pytest.raises(NoRelaySocket, match="no relay socket"):
        addresses.udp_socket(FAMILY_IPV4, None)
