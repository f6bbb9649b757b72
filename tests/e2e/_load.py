"""Concurrent load on one gateway, and what a local-profile gateway stored for it.

:func:`load_watching_usage` runs many clients (each call e.g. :func:`one_chat`) while it
polls ``/v1/usage``, so a test can check that committed + reserved + liability never
passed the limit at any moment;
:func:`local_permits` reads the permits and settlements a local gateway's SQLite holds.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

One = Callable[[httpx.AsyncClient, int], Awaitable[dict[str, Any]]]


async def one_chat(client: httpx.AsyncClient, i: int) -> dict[str, Any]:
    """Chat completion ``i`` (every third streamed, sizes varying with ``i``) of the
    ``gpt-up`` model: its status, permit, the mock's answer id and the body's text."""
    body: dict[str, Any] = {
        "model": "gpt-up", "max_tokens": 16 + i % 7,
        "messages": [{"role": "user", "content": f"request {i} " * (1 + i % 4)}]}
    if i % 3 == 0:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            text = (await r.aread()).decode()
    else:
        r = await client.post("/v1/chat/completions", json=body)
        text = r.text
    found = re.search(r'"id":"chatcmpl-mock-(\d+)"', text) if r.status_code == 200 else None
    return {"status": r.status_code, "permit": r.headers.get("x-inferplane-permit"),
            "mock": int(found.group(1)) if found else None, "body": text}


def load_watching_usage(url: str, key: str, one: One, *, clients: int, each: int
                        ) -> tuple[list[dict[str, Any]], list[int]]:
    """``clients`` concurrent clients, each making ``each`` calls ``one(client, i)`` one
    after the other, while the team's day usage is polled: (every call's result, the
    team's committed + reserved + liability µUSD at each observation)."""
    observed: list[int] = []

    async def run() -> list[dict[str, Any]]:
        n = clients * each
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120,
                                     headers={"Authorization": f"Bearer {key}"}) as c:
            done = asyncio.Event()

            async def watch() -> None:
                while not done.is_set():
                    r = await c.get("/v1/usage")
                    for row in r.json()["data"]:  # absent until the first charge
                        if (row["scope"], row["window"]) == ("team", "day"):
                            observed.append(row["usd_committed"] + row["usd_reserved"]
                                            + row["usd_liability"])
                    await asyncio.sleep(0.005)
            watcher = asyncio.ensure_future(watch())

            async def client(w: int) -> list[dict[str, Any]]:
                return [await one(c, w * each + j) for j in range(each)]
            try:
                got = await asyncio.gather(*(client(w) for w in range(clients)))
                return [r for rs in got for r in rs]
            finally:
                done.set()
                await watcher

    return asyncio.run(run()), observed


def local_permits(db: Path, team: str, expected: int) -> dict[str, dict[str, Any]]:
    """Team ``team``'s permits in a local gateway's ``db`` with their settlement and how
    many settlements each has, once none is pending and ``expected`` exist (a stream's
    settlement may follow its last byte); what is there after 60 s otherwise."""
    end = time.monotonic() + 60
    while True:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute(
                "SELECT p.id, p.status, s.kind, s.usd_committed, s.tokens_committed,"
                " s.usd_liability, (SELECT count(*) FROM gov_settlements x"
                " WHERE x.permit_id = p.id) AS settlements FROM gov_permits p"
                " JOIN teams t ON t.id = p.team_id LEFT JOIN gov_settlements s"
                " ON s.permit_id = p.id WHERE t.name = ?", (team,)).fetchall()
        finally:
            conn.close()
        if (not any(r["status"] == "pending" for r in rows) and len(rows) >= expected) \
                or time.monotonic() > end:
            return {r["id"]: dict(r) for r in rows}
        time.sleep(0.1)
