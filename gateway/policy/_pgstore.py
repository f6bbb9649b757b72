"""Policy documents and their generations in the shared Postgres database (ADR-046).

:func:`publish` is the only writer: it locks ``policy_state``, applies the changes to the
current document set, validates the WHOLE new set (:func:`compile_documents`, all or
nothing), stores it as the next generation with its fingerprint and author, appends one
``policy_changes`` row per document, and ``NOTIFY inferplane_policy``. Admission holds
``policy_state`` FOR SHARE, so a publish waits for in-flight admissions and an admission
never sees half a generation.

:class:`PostgresPolicySource` is a gateway's view of it: it LISTENs for the notify (and
polls every ``refresh_s`` in case a notify was missed), loads and compiles the new
generation and swaps its snapshot in one attribute assignment.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from typing import Any

import msgspec
import psycopg
from psycopg.types.json import Jsonb

import sql
from gateway.db import Pool, connection, fetch_all, fetch_one
from gateway.errors import InferplaneError, NotFound
from gateway.policy._compile import Compiled, compile_all, fingerprint
from gateway.policy._compiled import EMPTY_SNAPSHOT, PolicySnapshot
from gateway.policy._tasks import BackgroundTask

log = logging.getLogger("mayu.policy")
CHANNEL = "inferplane_policy"


class GenerationInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Which generation is published, in which authority namespace."""

    namespace: str
    generation: int
    fingerprint: str


class CurrentPolicy(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    generation: int
    fingerprint: str
    documents: dict[str, dict[str, Any]]
    """The whole published set: ``{name: document}``."""
    author: str | None = None
    created_at: datetime | None = None


class PolicyChange(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    generation: int
    name: str
    action: str
    """``put`` or ``delete``."""
    author: str
    at: datetime
    before: dict[str, Any] | None
    after: dict[str, Any] | None


def _compile(documents: dict[str, dict[str, Any]]) -> Compiled:
    names = sorted(documents)
    return compile_all([documents[n] for n in names], origins=names)


async def publish(conn: psycopg.AsyncConnection[Any], *,
                  put: dict[str, dict[str, Any]] | None = None,
                  delete: list[str] | None = None, author: str) -> GenerationInfo:
    """Apply ``put``/``delete`` as ONE new generation (or raise, changing nothing).

    Raises :class:`gateway.policy.PolicyInvalid` (every problem with its path) if the
    resulting set does not compile, :class:`gateway.errors.NotFound` for deleting a name
    that is not published. Publishing a set equal to the current one (same fingerprint)
    is a no-op that returns the current generation, so a retried PUT is idempotent.
    """
    put, delete = put or {}, delete or []
    async with conn.transaction():
        state = await fetch_one(conn, sql.queries["policy_state_for_update"])
        assert state is not None
        before: dict[str, dict[str, Any]] = dict(state["documents"])
        after = dict(before)
        for name in delete:
            if name not in after:
                raise NotFound(f"policy {name!r} is not published")
            del after[name]
        after.update(put)
        _compile(after)
        digest = fingerprint(list(after.values()))
        if digest == state["fingerprint"] and state["generation"] > 0:
            return GenerationInfo(namespace=state["namespace"],
                                  generation=state["generation"], fingerprint=digest)
        generation = state["generation"] + 1
        await conn.execute(sql.queries["policy_insert_generation"], {
            "generation": generation, "fingerprint": digest, "documents": Jsonb(after),
            "author": author})
        for name in sorted({*put, *delete}):
            await conn.execute(sql.queries["policy_insert_change"], {
                "generation": generation, "name": name, "author": author,
                "action": "put" if name in after else "delete",
                "before": None if name not in before else Jsonb(before[name]),
                "after": None if name not in after else Jsonb(after[name])})
        await conn.execute(sql.queries["policy_set_state"],
                           {"generation": generation, "fingerprint": digest})
        info = GenerationInfo(namespace=state["namespace"], generation=generation,
                              fingerprint=digest)
        # Delivered at commit, so a listener never reads a generation that is not there.
        await conn.execute(sql.queries["policy_notify"],
                           {"payload": json.dumps(msgspec.to_builtins(info))})
    return info


async def current(conn: psycopg.AsyncConnection[Any]) -> CurrentPolicy:
    """The published generation with its whole document set."""
    row = await fetch_one(conn, sql.queries["policy_current"])
    assert row is not None
    return CurrentPolicy(namespace=row["namespace"], generation=row["generation"],
                         fingerprint=row["fingerprint"], documents=dict(row["documents"]),
                         author=row["author"], created_at=row["created_at"])


async def changes(conn: psycopg.AsyncConnection[Any], *, since: int = 0) -> list[PolicyChange]:
    """Every document change in generations after ``since``, oldest first."""
    rows = await fetch_all(conn, sql.queries["policy_changes_since"], {"since": since})
    return [PolicyChange(**r) for r in rows]


class PostgresPolicySource:
    """A :class:`gateway.policy.PolicySource` following the database's generations."""

    def __init__(self, pool: Pool, *, refresh_s: float = 1.0) -> None:
        # The LISTEN connection is opened outside the pool from the pool's DSN; open_pool
        # always builds pools from a string (psycopg_pool would also take a callable).
        if not isinstance(pool.conninfo, str):
            raise TypeError("PostgresPolicySource needs a pool built from a DSN string")
        self._pool, self._conninfo = pool, pool.conninfo
        self._refresh_s = refresh_s
        self._snapshot = EMPTY_SNAPSHOT
        self._follower = BackgroundTask("policy-follow")

    def snapshot(self) -> PolicySnapshot:
        return self._snapshot

    async def refresh(self) -> bool:
        """Load the published generation if it is not the current snapshot's."""
        async with connection(self._pool, "policy store") as conn:
            generation = await fetch_one(conn, sql.queries["current_generation"])
            assert generation is not None
            if (generation["generation"] == self._snapshot.generation
                    and self._snapshot.namespace != EMPTY_SNAPSHOT.namespace):
                return False
            published = await current(conn)
        rules, routing, guardrails = _compile(published.documents)
        if published.generation < self._snapshot.generation:
            # A slower concurrent refresh already installed a newer generation.
            return False
        self._snapshot = PolicySnapshot(  # one assignment: readers never see a mix
            namespace=published.namespace, generation=published.generation,
            fingerprint=published.fingerprint, rules=rules, routing=routing,
            guardrails=guardrails)
        log.info("policy generation %d loaded (%d rules, %d routed models, %d guardrail "
                 "documents, %s)", published.generation, len(rules), len(routing),
                 len(guardrails), published.fingerprint[:12])
        return True

    async def start(self) -> None:
        """Load the current generation (raising if the database is unreachable), then
        follow notifications in the background."""
        await self.refresh()
        self._follower.start(self._follow)

    async def stop(self) -> None:
        await self._follower.stop()

    async def _follow(self) -> None:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo,
                                                             autocommit=True)
            except psycopg.OperationalError as exc:
                log.warning("policy LISTEN connection failed (%s); polling", exc)
                await self._poll_once()
                await asyncio.sleep(self._refresh_s)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    await self._poll_once()  # anything published before LISTEN
                    while True:
                        async for _ in conn.notifies(timeout=self._refresh_s, stop_after=1):
                            pass
                        await self._poll_once()
            except psycopg.OperationalError as exc:
                log.warning("policy LISTEN connection lost (%s); reconnecting", exc)
                await asyncio.sleep(self._refresh_s)

    async def _poll_once(self) -> None:
        try:
            await self.refresh()
        except InferplaneError as exc:
            # Keep the last snapshot: admission compares generations in the database,
            # so a stale snapshot fails closed (503), never open.
            log.error("policy refresh failed, keeping generation %d: %s",
                      self._snapshot.generation, exc.message)
        except Exception:
            log.exception("policy refresh failed, keeping generation %d",
                          self._snapshot.generation)
