"""A TCP proxy that loses one answer on request, standing in for "the heartbeat's
response was lost after the control plane committed it".

``python -m tests.e2e._dropproxy LISTEN_PORT TARGET_PORT FLAG_FILE`` forwards every
connection to ``127.0.0.1:TARGET_PORT`` byte for byte. While ``FLAG_FILE`` exists, the
first bytes the target sends back on any connection are dropped instead: the flag is
removed and both sides are closed, so the request was fully delivered (and processed)
but its answer never arrives.
"""

from __future__ import annotations

import asyncio
import os
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                flag: str | None, other: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            if flag is not None and os.path.exists(flag):
                os.unlink(flag)
                other.close()
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(listen_port: int, target_port: int, flag: str) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w, flag=None, other=client_w),
                             _pipe(server_r, client_w, flag=flag, other=server_w))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
