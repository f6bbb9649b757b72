"""A TCP proxy the test controls: byte for byte to a target, optionally losing one answer
or keeping what clients sent.

``python -m tests.e2e._tcpproxy LISTEN_PORT TARGET_HOST TARGET_PORT [--drop-flag FILE]
[--tap FILE]`` forwards every connection on 127.0.0.1 and prints ``ready`` once it
listens.

- Plain, it stands in for "the database went away": killing the process drops every
  proxied connection at once and refuses new ones, which is what a gateway sees when its
  database dies, without stopping the machine's shared Postgres server.
- ``--drop-flag FILE``: while FILE exists, the first bytes the target sends back on any
  connection are dropped instead — the flag is removed and both sides are closed, so the
  request was fully delivered (and processed) but its answer never arrives ("the
  heartbeat's response was lost after the control plane committed it", a lost commit
  acknowledgement).
- ``--tap FILE``: the bytes clients sent are appended to FILE, so a test reads the
  headers an upstream got (the ``traceparent`` the gateway sent) without changing the
  upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                other: asyncio.StreamWriter, drop_flag: str | None = None,
                tap: Path | None = None) -> None:
    try:
        while data := await reader.read(65536):
            if drop_flag is not None and os.path.exists(drop_flag):
                os.unlink(drop_flag)
                other.close()
                break
            if tap is not None:
                with tap.open("ab") as f:
                    f.write(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(listen_port: int, host: str, port: int, *, drop_flag: str | None,
               tap: Path | None) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(host, port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w, other=client_w, tap=tap),
                             _pipe(server_r, client_w, other=server_w, drop_flag=drop_flag))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("listen_port", type=int)
    ap.add_argument("target_host")
    ap.add_argument("target_port", type=int)
    ap.add_argument("--drop-flag", help="lose the next answer while this file exists")
    ap.add_argument("--tap", type=Path, help="append what clients send to this file")
    a = ap.parse_args()
    asyncio.run(main(a.listen_port, a.target_host, a.target_port, drop_flag=a.drop_flag,
                     tap=a.tap))
