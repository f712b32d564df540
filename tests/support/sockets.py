"""Raw-socket helpers for the servers' connection-discipline tests."""

from __future__ import annotations

import asyncio


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closes the connection (EOF or reset) within `within` seconds."""
    try:
        while await asyncio.wait_for(reader.read(65536), within):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True
