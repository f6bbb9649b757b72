"""Helpers for the shared-store integration tests: a team, a key, and admission plans."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from gateway.governance import AdmissionRequest, Charge, build_request
from gateway.keys import PostgresKeyStore, Principal, TeamLimits, hash_key
from gateway.policy import EMPTY_SNAPSHOT, PolicySnapshot

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


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
