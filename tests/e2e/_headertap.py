"""A TCP forwarder that keeps what clients sent, for tests that check request headers.

``python -m tests.e2e._headertap LISTEN_PORT TARGET_PORT OUT_FILE`` forwards every
connection on 127.0.0.1 byte for byte (as ``tests/e2e/_tcpproxy.py``) and appends the
bytes clients sent to ``OUT_FILE``, so a test can read the headers an upstream got (the
``traceparent`` the gateway sent) without changing the upstream.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                tap: Path | None) -> None:
    try:
        while data := await reader.read(65536):
            if tap is not None:
                with tap.open("ab") as f:
                    f.write(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(listen_port: int, target_port: int, tap: Path) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w, tap), _pipe(server_r, client_w, None))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])))
