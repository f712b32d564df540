"""Is a STUNner listener up yet, and is a local port free for one?"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time


async def wait_until_serving(
    address: str, port: int, proc: subprocess.Popen[bytes], timeout: float = 15.0
) -> None:
    """Poll with TCP connects until stunnerd accepts on `address:port`, or fail if it exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stunnerd exited with code {proc.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(address, port)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"stunnerd did not start listening within {timeout:g} s")


def port_busy(port: int) -> str | None:
    """Why a demo cannot have UDP `port`, or None if it is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            return f"port {port}/udp is busy ({exc.strerror}); try --port"
    return None
