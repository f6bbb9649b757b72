"""Helpers for the store integration tests: both stores of a profile, a team, a key, and
admission plans."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.config import DatabaseSettings
from gateway.governance import (
    AdmissionRequest,
    Charge,
    LocalGovernanceStore,
    PostgresGovernanceStore,
    build_request,
)
from gateway.keys import PostgresKeyStore, Principal, SqliteKeyStore, TeamLimits, hash_key
from gateway.policy import EMPTY_SNAPSHOT, PolicySnapshot

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@asynccontextmanager
async def store_pair(kind: str, request: pytest.FixtureRequest, tmp_path: Path, *,
                     pool_max_size: int = 4) -> AsyncIterator[tuple[Any, Any]]:
    """(key store, governance store) of ``kind``, open, closed afterwards: ``local``
    (SQLite in ``tmp_path``), ``postgres``, or ``postgres-merged`` (admissions and
    settlements coalesced, 2 a call) on the test's fresh database (``pg_dsn``)."""
    if kind == "local":
        db = str(tmp_path / "mayu.db")
        keys, gov = SqliteKeyStore(db), LocalGovernanceStore(db)
        await keys.open()
        await gov.open()
        try:
            yield keys, gov
        finally:
            await gov.close()
            await keys.close()
        return
    from gateway.db import open_pool

    request.getfixturevalue("monkeypatch").setenv("IPT_STORES_DSN",
                                                  request.getfixturevalue("pg_dsn"))
    pool = open_pool(DatabaseSettings(dsn_ref="env:IPT_STORES_DSN", pool_min_size=1,
                                      pool_max_size=pool_max_size))
    await pool.open(wait=True)
    try:
        coalesce = 2 if kind == "postgres-merged" else 0
        yield PostgresKeyStore(pool), PostgresGovernanceStore(
            pool, coalesce=coalesce, settle_coalesce=coalesce, merge=bool(coalesce))
    finally:
        await pool.close()


async def principal(keys: PostgresKeyStore, *, team: str = "t1",
                    limits: TeamLimits | None = None, user: str | None = None) -> Principal:
    """A new team (unless it exists) with one new key, resolved like an ingress would."""
    if await keys.get_team(team) is None:
        await keys.create_team(name=team, limits=limits or TeamLimits())
    plaintext, _ = await keys.create_key(team=team, user=user)
    resolved = await keys.resolve(hash_key(plaintext))
    assert resolved is not None
    return resolved


def request(p: Principal, *, tokens: int = 100, usd: int = 1_000, rid: str = "r",
            snapshot: PolicySnapshot = EMPTY_SNAPSHOT, now: datetime = NOW) -> AdmissionRequest:
    return build_request(p, snapshot, request_id=rid, model="m", token_bound=tokens,
                         usd_bound=usd, now=now)


def with_charges(req: AdmissionRequest, *charges: Charge) -> AdmissionRequest:
    """The request with extra explicit charges (kept in lock order)."""
    import msgspec

    merged = tuple(sorted((*req.charges, *charges), key=lambda c: c.counter))
    return msgspec.structs.replace(req, charges=merged)


PRERELEASE_DUMP = Path(__file__).parent / "data" / "pre_0_1_0_at_0009.sql.gz"
"""A database built by the pre-release chain (inferplane cdf51f7, revision 0009) holding
one permit settled complete (committed 1,234 µUSD), one settled uncertain (liability
5,000) and one pending (reserved 5,000) on team t1's day window and policy account:
``pg_dump --inserts`` of it, gzipped (it is data, not code to read)."""


def load_prerelease(dsn: str) -> None:
    """Restore :data:`PRERELEASE_DUMP` into the empty database at ``dsn``."""
    import gzip

    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(gzip.decompress(PRERELEASE_DUMP.read_bytes()).decode())
