"""TURN over TLS and DTLS: real handshakes on loopback with a certificate made in the test.

We test: the self-signed certificate helper; bad base64/PEM and mismatched keys refused by
`server_ssl_context`, and by `Stunner.apply` with the previous config still serving; TURN-TLS
relaying with aioice's client and no loss; TLS 1.1 and plain TCP refused on the TLS port;
TURN-DTLS relaying (Allocate, ChannelBind, ChannelData) with a pyOpenSSL DTLS client through
the cookie exchange; `openssl s_client -dtls1_2` completing a handshake; a ClientHello without
a cookie answered by a HelloVerifyRequest and leaving no session, that HelloVerifyRequest
built in Python byte for byte as OpenSSL's; a stalled handshake freed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import socket
import ssl
import time
import warnings
from pathlib import Path

import pytest
from aioice.turn import create_turn_endpoint
from cryptography import x509
from OpenSSL import SSL

from stunner_api import stun
from stunner_api.dataplane import StunnerConfig
from stunner_api.dataplane_load import load_config
from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import ApplyError, Stunner
from stunnerd.transport import certificates, dtls
from stunnerd.transport.transports import DtlsTransport
from tests.support.turnclient import (
    HOST,
    PASSWORD,
    REALM,
    USERNAME,
    RawClient,
    error_code,
    free_port,
    running_stunner,
    start_peer,
)

from .test_turn_aioice import Receiver

CERT, KEY = certificates.self_signed_certificate(HOST)
OTHER_CERT, OTHER_KEY = certificates.self_signed_certificate("other.example")


def tls_config(
    listeners: list[tuple[str, int]], endpoints: list[str], cert: str = CERT, key: str = KEY
) -> StunnerConfig:
    text = {
        "version": "v1",
        "admin": {"name": "test", "healthcheck_endpoint": ""},
        "auth": {
            "type": "static",
            "realm": REALM,
            "credentials": {"username": USERNAME, "password": PASSWORD},
        },
        "listeners": [
            {
                "name": f"testns/gw/{protocol.lower()}",
                "protocol": protocol,
                "address": HOST,
                "port": port,
                "routes": ["testns/backend"],
                "cert": cert,
                "key": key,
            }
            for protocol, port in listeners
        ],
        "clusters": [{"name": "testns/backend", "type": "STATIC", "endpoints": endpoints}],
    }
    return load_config(json.dumps(text))


def ca_file(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_bytes(base64.b64decode(CERT))
    return str(path)


def dtls_protocol(stunner: Stunner) -> dtls.DtlsListenerProtocol:
    transport = stunner.listeners["testns/gw/turn-dtls"].transport
    assert isinstance(transport, DtlsTransport)
    protocol = transport.protocol
    assert protocol is not None
    return protocol


def session_ports(protocol: dtls.DtlsListenerProtocol) -> list[int]:
    """The client ports with a DTLS session (the listener is dual-stack: IPv4-mapped keys)."""
    return [remote[1] for remote in protocol.sessions]


# ---- certificates and contexts


def test_self_signed_certificate_has_san_and_one_year_validity() -> None:
    cert = x509.load_pem_x509_certificate(base64.b64decode(CERT))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [HOST]
    other = x509.load_pem_x509_certificate(base64.b64decode(OTHER_CERT))
    other_san = other.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert other_san.get_values_for_type(x509.DNSName) == ["other.example"]
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 364 <= days <= 366
    context = certificates.server_ssl_context(CERT, KEY)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_decode_pem_names_the_problem() -> None:
    with pytest.raises(ValueError, match="^cert is not valid base64 PEM: bad base64"):
        certificates.decode_pem("not base64!", "cert")
    with pytest.raises(ValueError, match="^key is not valid base64 PEM: no PEM block"):
        certificates.decode_pem(base64.b64encode(b"just text").decode(), "key")
    pem = base64.b64decode(CERT)
    wrapped = "\n".join(CERT[i : i + 64] for i in range(0, len(CERT), 64))
    assert certificates.decode_pem(wrapped, "cert") == pem


def test_server_ssl_context_refuses_bad_pem_and_mismatched_key() -> None:
    with pytest.raises(ValueError, match="key does not match the certificate"):
        certificates.server_ssl_context(CERT, OTHER_KEY)
    garbage = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(ValueError, match="cert is not valid base64 PEM"):
        certificates.server_ssl_context(garbage.decode(), KEY)
    with pytest.raises(ValueError, match="key is not valid base64 PEM") as info:
        certificates.server_ssl_context(CERT, CERT)  # a certificate where the key should be
    assert KEY not in str(info.value)


# ---- TURN-TLS


def test_turn_tls_relays_with_aioice_without_loss(tmp_path: Path) -> None:
    async def scenario() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        config = tls_config([("TURN-TLS", port)], [f"{HOST}/32"])
        client_context = ssl.create_default_context(cafile=ca_file(tmp_path))
        async with running_stunner(config):
            turn, receiver = await create_turn_endpoint(
                Receiver,
                server_addr=(HOST, port),
                username=USERNAME,
                password=PASSWORD,
                transport="tcp",
                ssl=client_context,
            )
            try:
                for i in range(200):
                    turn.sendto(b"packet-%04d" % i, (HOST, peer.port))
                    await asyncio.sleep(0.002)
                deadline = time.monotonic() + 3
                while len(receiver.received) < 200 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
            finally:
                turn.close()
                await asyncio.sleep(0)
        peer.close()
        assert sorted(receiver.received) == [b"packet-%04d" % i for i in range(200)]

    asyncio.run(scenario())


def test_turn_tls_refuses_tls11_and_plain_tcp(tmp_path: Path) -> None:
    async def scenario() -> None:
        port = free_port()
        config = tls_config([("TURN-TLS", port)], [f"{HOST}/32"])
        async with running_stunner(config):
            old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            old.load_verify_locations(ca_file(tmp_path))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.1 is, on purpose
                old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
                old.maximum_version = ssl.TLSVersion.TLSv1_1
            with pytest.raises((ssl.SSLError, ConnectionError)):
                _, writer = await asyncio.open_connection(HOST, port, ssl=old)
                writer.close()

            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(Message(Method.BINDING, Class.REQUEST).encode())
            try:
                answer = await asyncio.wait_for(reader.read(4096), 5)
            except ConnectionError:
                answer = b""
            writer.close()
            # Nothing, or a TLS alert record: never a STUN answer.
            assert answer == b"" or answer[0] == 0x15
            with pytest.raises(stun.StunError):
                stun.parse_message(answer)

    asyncio.run(scenario())


# ---- TURN-DTLS


class DtlsClient(RawClient):
    """`RawClient` with a pyOpenSSL DTLS client (memory BIOs) between it and the socket."""

    def __init__(self, server: tuple[str, int], cafile: str) -> None:
        super().__init__(server)
        self.context = SSL.Context(SSL.DTLS_METHOD)
        self.context.set_verify(SSL.VERIFY_PEER, lambda conn, cert, errnum, depth, ok: bool(ok))
        self.context.load_verify_locations(cafile)
        self.handshake_progress = asyncio.Event()
        self.restart()

    def restart(self) -> None:
        """A new DTLS connection from the same socket, as a client restarted behind a NAT."""
        self.conn = SSL.Connection(self.context)
        self.conn.set_connect_state()
        self.established = False
        self.nonce = None
        self.datagrams_in = 0

    @classmethod
    async def open(cls, server: tuple[str, int], cafile: str) -> DtlsClient:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_datagram_endpoint(
            lambda: cls(server, cafile), local_addr=(HOST, 0)
        )
        return client

    async def handshake(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.conn.do_handshake()
            except SSL.WantReadError:
                self._flush()
            else:
                self._flush()
                self.established = True
                return
            self.handshake_progress.clear()
            wait = self.conn.DTLSv1_get_timeout() or 1.0
            try:
                await asyncio.wait_for(self.handshake_progress.wait(), wait)
            except TimeoutError:
                self.conn.DTLSv1_handle_timeout()
            assert time.monotonic() < deadline, "DTLS handshake did not complete"

    def _flush(self) -> None:
        try:
            data = self.conn.bio_read(65536)
        except SSL.WantReadError:
            return
        assert self.transport is not None
        self.transport.sendto(data, self.server)

    def send_raw(self, data: bytes) -> None:
        self.conn.send(data)
        self._flush()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.datagrams_in += 1
        self.conn.bio_write(data)
        self.handshake_progress.set()
        if not self.established:
            return
        while True:
            try:
                plaintext = self.conn.recv(65536)
            except (SSL.WantReadError, SSL.ZeroReturnError):
                return
            super().datagram_received(plaintext, addr)


def client_hello() -> bytes:
    """A first ClientHello, without a cookie."""
    context = SSL.Context(SSL.DTLS_METHOD)
    conn = SSL.Connection(context)
    conn.set_connect_state()
    with pytest.raises(SSL.WantReadError):
        conn.do_handshake()
    hello: bytes = conn.bio_read(65536)
    return hello


def test_turn_dtls_relays_channel_data(tmp_path: Path) -> None:
    async def scenario() -> None:
        peer = await start_peer(echo=True)
        port = free_port()
        config = tls_config([("TURN-DTLS", port)], [f"{HOST}/32"])
        async with running_stunner(config) as stunner:
            client = await DtlsClient.open((HOST, port), ca_file(tmp_path))
            try:
                await client.handshake()
                protocol = dtls_protocol(stunner)
                assert client.transport is not None
                assert session_ports(protocol) == [client.transport.get_extra_info("sockname")[1]]

                response = await client.allocate()
                assert response.message_class == Class.SUCCESS, error_code(response)
                assert response.attributes["XOR-RELAYED-ADDRESS"][0] == HOST
                bound = await client.channel_bind(0x4000, (HOST, peer.port))
                assert bound.message_class == Class.SUCCESS, error_code(bound)
                for i in range(50):
                    client.send_channel_data(0x4000, b"dtls-%02d" % i)
                echoes = [await asyncio.wait_for(client.channel_data.get(), 3) for _ in range(50)]
                assert sorted(echoes) == [(0x4000, b"dtls-%02d" % i) for i in range(50)]
                allocations = stunner.listeners["testns/gw/turn-dtls"].server.allocations
                assert len(allocations) == 1

                # A new handshake from the same address replaces the session, and the
                # allocation of the old one is released.
                old_session = next(iter(protocol.sessions.values()))
                client.restart()
                await client.handshake()
                assert len(protocol.sessions) == 1
                assert next(iter(protocol.sessions.values())) is not old_session
                assert allocations == {}
                assert (await client.allocate()).message_class == Class.SUCCESS
                bound = await client.channel_bind(0x4001, (HOST, peer.port))
                assert bound.message_class == Class.SUCCESS, error_code(bound)
                client.send_channel_data(0x4001, b"again")
                again = await asyncio.wait_for(client.channel_data.get(), 3)
                assert again == (0x4001, b"again")

                # close_notify ends the session and the allocation with it.
                client.conn.shutdown()
                client._flush()
                deadline = time.monotonic() + 3
                while protocol.sessions and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert protocol.sessions == {}
                assert allocations == {}
            finally:
                client.close()
                peer.close()

    asyncio.run(scenario())


def test_split_records_packs_whole_records_into_datagrams() -> None:
    def record(size: int, fill: bytes) -> bytes:
        return bytes([22, 0xFE, 0xFD]) + bytes(8) + size.to_bytes(2, "big") + fill * size

    a, b, c = record(800, b"a"), record(800, b"b"), record(100, b"c")
    assert dtls.split_records(a + b + c, limit=1400) == [a, b + c]
    assert dtls.split_records(a + b + c, limit=100_000) == [a + b + c]
    assert dtls.split_records(b"\x16short") == [b"\x16short"]  # a fragment is passed on as is
    hello = client_hello()
    assert dtls.client_hello_random(hello) is not None
    assert dtls.client_hello_random(a) is None


def test_client_hello_without_cookie_gets_hello_verify_request_and_no_state() -> None:
    async def scenario() -> None:
        port = free_port()
        config = tls_config([("TURN-DTLS", port)], [f"{HOST}/32"])
        async with running_stunner(config) as stunner:
            loop = asyncio.get_running_loop()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.bind((HOST, 0))
                await loop.sock_sendto(sock, client_hello(), (HOST, port))
                answer = await asyncio.wait_for(loop.sock_recv(sock, 65536), 3)
                await loop.sock_sendto(sock, b"\x16garbage", (HOST, port))
                await asyncio.sleep(0.1)
            # A handshake record carrying HelloVerifyRequest (handshake type 3).
            assert answer[0] == 22 and answer[13] == 3
            assert dtls_protocol(stunner).sessions == {}

    asyncio.run(scenario())


def test_stalled_handshake_is_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtls, "HANDSHAKE_TIMEOUT", 0.4)

    async def scenario() -> None:
        port = free_port()
        config = tls_config([("TURN-DTLS", port)], [f"{HOST}/32"])
        async with running_stunner(config) as stunner:
            protocol = dtls_protocol(stunner)
            loop = asyncio.get_running_loop()
            conn = SSL.Connection(SSL.Context(SSL.DTLS_METHOD))
            conn.set_connect_state()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.bind((HOST, 0))
                with pytest.raises(SSL.WantReadError):
                    conn.do_handshake()
                await loop.sock_sendto(sock, conn.bio_read(65536), (HOST, port))
                conn.bio_write(await asyncio.wait_for(loop.sock_recv(sock, 65536), 3))
                with pytest.raises(SSL.WantReadError):
                    conn.do_handshake()  # the ClientHello again, now with the cookie
                await loop.sock_sendto(sock, conn.bio_read(65536), (HOST, port))
                flight = await asyncio.wait_for(loop.sock_recv(sock, 65536), 3)
                assert flight[0] == 22 and flight[13] == 2  # ServerHello: a session exists
                assert session_ports(protocol) == [sock.getsockname()[1]]
                # The client never answers: the session is gone after the timeout.
                deadline = time.monotonic() + 3
                while protocol.sessions and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert protocol.sessions == {}

    asyncio.run(scenario())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")
def test_openssl_s_client_dtls_handshake(tmp_path: Path) -> None:
    async def scenario() -> None:
        port = free_port()
        config = tls_config([("TURN-DTLS", port)], [f"{HOST}/32"])
        async with running_stunner(config):
            process = await asyncio.create_subprocess_exec(
                "openssl",
                "s_client",
                "-dtls1_2",
                "-connect",
                f"{HOST}:{port}",
                "-CAfile",
                ca_file(tmp_path),
                "-verify_return_error",
                "-brief",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            output, _ = await asyncio.wait_for(process.communicate(), 10)
            text = output.decode(errors="replace")
            assert "CONNECTION ESTABLISHED" in text, text
            assert "Protocol version: DTLSv1.2" in text, text

    asyncio.run(scenario())


# ---- config apply


def test_apply_with_bad_certificate_keeps_previous_config(tmp_path: Path) -> None:
    async def scenario() -> None:
        peer = await start_peer(echo=True)
        tls_port, udp_port = free_port(), free_port()
        good = tls_config([("TURN-TLS", tls_port), ("TURN-UDP", udp_port)], [f"{HOST}/32"])
        async with running_stunner(good) as stunner:
            for cert, key, problem in [
                (CERT, OTHER_KEY, "key does not match the certificate"),
                ("bm90IFBFTQ==", KEY, "cert is not valid base64 PEM"),
            ]:
                bad = tls_config(
                    [("TURN-TLS", tls_port), ("TURN-UDP", udp_port)], [f"{HOST}/32"], cert, key
                )
                with pytest.raises(ApplyError, match=f"listener testns/gw/turn-tls: {problem}"):
                    await stunner.apply(bad)
                assert stunner.config == good

            # The TLS listener was restarted with the old certificate and still relays.
            client_context = ssl.create_default_context(cafile=ca_file(tmp_path))
            turn, receiver = await create_turn_endpoint(
                Receiver,
                server_addr=(HOST, tls_port),
                username=USERNAME,
                password=PASSWORD,
                transport="tcp",
                ssl=client_context,
            )
            try:
                turn.sendto(b"still-there", (HOST, peer.port))
                deadline = time.monotonic() + 3
                while not receiver.received and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert receiver.received == [b"still-there"]
            finally:
                turn.close()
                await asyncio.sleep(0)
            udp = await RawClient.connect((HOST, udp_port))
            try:
                assert (await udp.allocate()).message_class == Class.SUCCESS
            finally:
                udp.close()
        peer.close()

    asyncio.run(scenario())


def test_hello_verify_request_is_openssls_byte_for_byte() -> None:
    """Python's HelloVerifyRequest (no OpenSSL per cookieless ClientHello) is what
    DTLSv1_listen writes for the same cookie, and the cookie parser finds it in the retry."""
    cookies = dtls.CookieJar()
    addr = (HOST, 40000)
    listener = SSL.Connection(dtls.dtls_context(CERT, KEY, cookies))
    listener.set_accept_state()
    listener.set_ciphertext_mtu(dtls.MAX_DATAGRAM)
    listener.set_app_data(addr)
    client = SSL.Connection(SSL.Context(SSL.DTLS_METHOD))
    client.set_connect_state()
    with pytest.raises(SSL.WantReadError):
        client.do_handshake()
    hello = client.bio_read(65536)
    assert dtls.client_hello_cookie(hello) == b""
    listener.bio_write(hello)
    with pytest.raises(SSL.WantReadError):
        listener.DTLSv1_listen()
    theirs = listener.bio_read(65536)
    ours = dtls.hello_verify_request(hello, cookies.make(addr))
    assert ours == theirs
    client.bio_write(ours)
    with pytest.raises(SSL.WantReadError):
        client.do_handshake()
    retry = client.bio_read(65536)
    cookie = dtls.client_hello_cookie(retry)
    assert cookie is not None and cookies.check(addr, cookie)
    assert not cookies.check((HOST, 40001), cookie)  # bound to the address
    assert dtls.client_hello_cookie(retry[:70]) is None  # cut short
    fragment = retry[:19] + b"\0\0\x01" + retry[22:]  # fragment offset 1: not a whole hello
    assert dtls.client_hello_cookie(fragment) is None
