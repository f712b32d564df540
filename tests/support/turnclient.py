"""Test harness: run stunnerd in-process on loopback, echo peers, and a raw STUN/TURN client.

aioice is the "standard client" for the happy paths; `RawClient` builds exact requests (our
codec) for what a standard client never sends: bad credentials, stale nonces, CreatePermission,
Send indications, retransmissions, unknown attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from stunner_api import stun
from stunner_api.dataplane import StunnerConfig
from stunner_api.dataplane_load import load_config
from stunner_api.stun import Class, Message, Method
from stunnerd.process.daemon import Stunner
from stunnerd.turn.auth import NonceManager, long_term_key
from tests.support.ports import free_port as free_port  # the tests import it from here

HOST = "127.0.0.1"
USERNAME = "user-1"
PASSWORD = "pass-1"
REALM = "stunner.l7mp.io"
SECRET = "my-shared-secret"


def binding_answered(port: int, timeout: float = 15) -> bool:
    """True once a Binding request to 127.0.0.1:port is answered (within `timeout`): a
    stunnerd process started by a test is up."""
    request = Message(Method.BINDING, Class.REQUEST)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        sock.settimeout(0.2)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sock.sendto(request.encode(), (HOST, port))
            try:
                sock.recv(2048)
                return True
            except (TimeoutError, ConnectionRefusedError):
                continue
    return False


def make_config(
    port: int,
    endpoints: list[str],
    auth: dict[str, Any] | None = None,
    protocols: tuple[str, ...] = ("TURN-UDP", "TURN-TCP"),
    user_quota: int = 0,
    address: str = HOST,
    cluster_type: str = "STATIC",
    admin: dict[str, Any] | None = None,
) -> StunnerConfig:
    listeners = [
        {
            "name": f"testns/gw/{p.lower()}",
            "protocol": p,
            "address": address,
            "port": port,
            "routes": ["testns/backend"],
        }
        for p in protocols
    ]
    text = {
        "version": "v1",
        "admin": {
            "name": "test",
            "loglevel": "all:INFO",
            "user_quota": user_quota,
            "healthcheck_endpoint": "",  # each test picks its own port when it needs one
            **(admin or {}),
        },
        "auth": auth
        or {
            "type": "static",
            "realm": REALM,
            "credentials": {"username": USERNAME, "password": PASSWORD},
        },
        "listeners": listeners,
        "clusters": [{"name": "testns/backend", "type": cluster_type, "endpoints": endpoints}],
    }
    return load_config(json.dumps(text))


@contextlib.asynccontextmanager
async def running_stunner(
    config: StunnerConfig, nonces: NonceManager | None = None
) -> AsyncIterator[Stunner]:
    stunner = Stunner(nonces=nonces)
    await stunner.apply(config)
    try:
        yield stunner
    finally:
        await stunner.close()


class Peer(asyncio.DatagramProtocol):
    """A UDP peer on loopback that records what it gets and can echo it back."""

    def __init__(self, echo: bool = True) -> None:
        self.echo = echo
        self.received: list[tuple[bytes, tuple[str, int]]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.append((data, addr))
        if self.echo and self.transport is not None:
            self.transport.sendto(data, addr)

    @property
    def port(self) -> int:
        assert self.transport is not None
        port: int = self.transport.get_extra_info("sockname")[1]
        return port

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def start_peer(echo: bool = True, port: int = 0, host: str = HOST) -> Peer:
    loop = asyncio.get_running_loop()
    _, peer = await loop.create_datagram_endpoint(lambda: Peer(echo), local_addr=(host, port))
    return peer


class RawClient(asyncio.DatagramProtocol):
    """A minimal TURN client over UDP that sends exactly what a test asks for."""

    def __init__(
        self, server: tuple[str, int], username: str = USERNAME, password: str = PASSWORD
    ) -> None:
        self.server = server
        self.username = username
        self.password = password
        self.realm: str | None = None
        self.nonce: str | None = None
        self.transport: asyncio.DatagramTransport | None = None
        self.responses: dict[bytes, asyncio.Future[Message]] = {}
        self.indications: asyncio.Queue[Message] = asyncio.Queue()
        self.channel_data: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.raw: list[bytes] = []

    @classmethod
    async def connect(cls, server: tuple[str, int], **kwargs: str) -> RawClient:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_datagram_endpoint(
            lambda: cls(server, **kwargs), local_addr=(server[0], 0)
        )
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.raw.append(data)
        if stun.is_channel_data(data):
            self.channel_data.put_nowait(stun.unpack_channel_data(data))
            return
        message = stun.parse_message(data)
        if message.message_class == Class.INDICATION:
            self.indications.put_nowait(message)
            return
        future = self.responses.pop(message.transaction_id, None)
        if future is not None and not future.done():
            future.set_result(message)

    @property
    def key(self) -> bytes:
        assert self.realm is not None
        return long_term_key(self.username, self.realm, self.password)

    def send_raw(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.sendto(data, self.server)

    async def request(
        self, message: Message, sign: bool = True, timeout: float = 2.0, data: bytes | None = None
    ) -> Message:
        """Send `message` (signed with the known credentials unless sign=False) and await the
        response with its transaction id. `data` overrides the encoded bytes."""
        if sign and self.nonce is not None:
            message.attributes["USERNAME"] = self.username
            message.attributes["REALM"] = self.realm
            message.attributes["NONCE"] = self.nonce
        encoded = (
            data
            if data is not None
            else message.encode(integrity_key=self.key if sign and self.nonce is not None else None)
        )
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.responses[message.transaction_id] = future
        self.send_raw(encoded)
        return await asyncio.wait_for(future, timeout)

    async def authenticated(self, message: Message) -> Message:
        """Send with credentials, learning REALM/NONCE from a 401 or 438 first, like a client."""
        if self.nonce is None:
            probe = await self.request(Message(message.method, Class.REQUEST), sign=False)
            self.learn(probe)
        response = await self.request(message)
        if response.message_class == Class.ERROR and response.attributes["ERROR-CODE"][0] == 438:
            self.learn(response)
            message.transaction_id = Message(message.method, Class.REQUEST).transaction_id
            response = await self.request(message)
        return response

    def learn(self, response: Message) -> None:
        self.realm = response.attributes.get("REALM", self.realm)
        self.nonce = response.attributes.get("NONCE", self.nonce)

    async def allocate(self, **attributes: Any) -> Message:
        request = Message(Method.ALLOCATE, Class.REQUEST)
        request.attributes["REQUESTED-TRANSPORT"] = 17
        request.attributes.update(attributes)
        return await self.authenticated(request)

    async def create_permission(self, *peers: tuple[str, int]) -> Message:
        request = Message(Method.CREATE_PERMISSION, Class.REQUEST)
        request.attributes["XOR-PEER-ADDRESS"] = peers[0]
        data = None
        if len(peers) > 1:
            data = _with_extra_peers(request, peers[1:], self)
        if data is None:
            return await self.authenticated(request)
        return await self.request(request, data=data)

    async def channel_bind(self, channel: int, peer: tuple[str, int]) -> Message:
        request = Message(Method.CHANNEL_BIND, Class.REQUEST)
        request.attributes["CHANNEL-NUMBER"] = channel
        request.attributes["XOR-PEER-ADDRESS"] = peer
        return await self.authenticated(request)

    async def refresh(self, lifetime: int) -> Message:
        request = Message(Method.REFRESH, Class.REQUEST)
        request.attributes["LIFETIME"] = lifetime
        return await self.authenticated(request)

    def send_indication(self, peer: tuple[str, int], payload: bytes) -> None:
        indication = Message(Method.SEND, Class.INDICATION)
        indication.attributes["XOR-PEER-ADDRESS"] = peer
        indication.attributes["DATA"] = payload
        self.send_raw(indication.encode())

    def send_channel_data(self, channel: int, payload: bytes) -> None:
        self.send_raw(stun.pack_channel_data(channel, payload))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class RawTcpClient(RawClient):
    """`RawClient` over TURN-TCP: the same requests on one connection, frames read by their
    length (RFC 8656 §12.5), ChannelData sent padded to a multiple of 4."""

    def __init__(self, server: tuple[str, int], **kwargs: str) -> None:
        super().__init__(server, **kwargs)
        self.writer: asyncio.StreamWriter | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reading: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, server: tuple[str, int], **kwargs: str) -> RawClient:
        client = cls(server, **kwargs)
        reader, client.writer = await asyncio.open_connection(*server)
        client._reading = asyncio.get_running_loop().create_task(client._read(reader))
        return client

    @classmethod
    async def connect_tls(cls, server: tuple[str, int], context: ssl.SSLContext) -> RawClient:
        """The same over TURN-TLS."""
        client = cls(server)
        reader, client.writer = await asyncio.open_connection(*server, ssl=context)
        client._reading = asyncio.get_running_loop().create_task(client._read(reader))
        return client

    async def _read(self, reader: asyncio.StreamReader) -> None:
        buffer = bytearray()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                buffer += data
                while (length := stun.stream_frame_length(buffer)) is not None:
                    if len(buffer) < length:
                        break
                    frame = bytes(buffer[:length])
                    del buffer[:length]
                    self.datagram_received(frame, self.server)
        except (OSError, stun.StunError):
            pass
        finally:
            if not self.closed.done():
                self.closed.set_result(None)

    def send_raw(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)

    def send_channel_data(self, channel: int, payload: bytes) -> None:
        self.send_raw(stun.pack_channel_data(channel, payload, pad=True))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self._reading is not None:
            self._reading.cancel()


def _with_extra_peers(
    request: Message, extra: tuple[tuple[str, int], ...], client: RawClient
) -> bytes:
    """CreatePermission with several XOR-PEER-ADDRESS attributes (a dict holds one): append
    them by hand, then sign."""
    request.attributes["USERNAME"] = client.username
    request.attributes["REALM"] = client.realm
    request.attributes["NONCE"] = client.nonce
    body = request.encode(fingerprint=False)
    for peer in extra:
        value = stun.pack_xor_address(peer, request.transaction_id)
        body += struct.pack("!HH", 0x0012, len(value)) + value
    # MESSAGE-INTEGRITY covers the header with the length as if it were the last attribute.
    length = len(body) - 20 + 24
    signed = body[:2] + struct.pack("!H", length) + body[4:]
    mac = hmac.new(client.key, signed, hashlib.sha1).digest()
    return signed + struct.pack("!HH", 0x0008, 20) + mac


def error_code(response: Message) -> int | None:
    if response.message_class != Class.ERROR:
        return None
    code: int = response.attributes["ERROR-CODE"][0]
    return code
