"""Cache affinity's pins in the shared database, so every replica keeps a session where its
prompt cache is (the shared profile; ``sql/routing_queries.sql``, table ``routing_pins``).

A replica reads the database only for a session it holds no live pin for, and writes a pin
only when it changes or half its TTL has passed, in the background: a request never waits
for a write, and a database that is down costs affinity, never an answer. Only a session
key (a hash) and a deployment name are stored, never a payload.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("mayu.routing")


class SharedPins:
    """Pins in ``routing_pins`` through the shared profile's pool."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._writes: set[asyncio.Task[None]] = set()

    async def get(self, model: str, keys: tuple[str, ...]) -> tuple[str, float] | None:
        """The deployment pinned under the best live key, and its TTL left (seconds)."""
        import sql
        from gateway.db import connection, fetch_one

        try:
            async with connection(self._pool, "routing pins") as conn:
                row = await fetch_one(conn, sql.routing_queries["pin_get"],
                                      {"model": model, "keys": list(keys)})
        except Exception as exc:  # noqa: BLE001 — affinity is an optimisation
            log.warning("routing: pins not read (%s); routing without the shared pin", exc)
            return None
        return None if row is None else (str(row["deployment"]), float(row["ttl_s"]))

    def put(self, model: str, key: str, deployment: str, ttl_s: float) -> None:
        """Write a pin in the background."""
        task = asyncio.get_running_loop().create_task(self._put(model, key, deployment, ttl_s))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put(self, model: str, key: str, deployment: str, ttl_s: float) -> None:
        import sql
        from gateway.db import connection

        try:
            async with connection(self._pool, "routing pins") as conn:
                await conn.execute(sql.routing_queries["pin_put"],
                                   {"model": model, "key": key, "deployment": deployment,
                                    "ttl_s": ttl_s})
        except Exception as exc:  # noqa: BLE001 — affinity is an optimisation
            log.warning("routing: pin not written (%s)", exc)

    async def drain(self) -> None:
        """Wait for the writes in flight (tests, shutdown)."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
