"""Make ``at_0_1_0.sql.gz``: a database written by inferplane 0.1.0 itself.

Run from a checkout of the tag, so the 0.1.0 migrations and stores write it::

    git worktree add --detach /tmp/rel v0.1.0
    cd /tmp/rel && INFERPLANE_TEST_PG_DSN=postgresql://postgres@127.0.0.1:5432/postgres \\
        PYTHONPATH=. python /path/to/make_at_0_1_0.py /path/to/at_0_1_0.sql.gz

Team ``t1`` (20,000 µUSD a day) with ``alice`` (a member budget of 15,000 µUSD a day), her
key and a policy account ``account:r1:team=t1:month:2026-11`` (limit 50,000); four
requests on 29 November 2026, each charged to all of them:

- ``done``: settled complete, 1,234 µUSD and 60 tokens committed, with its request facts;
- ``cut``: settled uncertain, its bound (2,000) left as liability;
- ``cut2``: settled uncertain, liability 1,500 (the upgrade test resolves it);
- ``open``: pending, 3,000 reserved.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
import sys

import msgspec
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from gateway.governance import (
    Charge,
    Outcome,
    OutcomeKind,
    Permit,
    PostgresGovernanceStore,
    RequestFacts,
    settlement_for,
)
from gateway.keys import MemberLimits, PostgresKeyStore, TeamLimits
from tests.conftest import create_database, drop_database, dsn_for, migrate
from tests.integration._pg_helpers import principal, request, with_charges
from tests.settling import exact, settlement

ACCOUNT = Charge(counter="account:r1:team=t1:month:2026-11", kind="account",
                 dimension="usd", amount=0, limit=50_000, window="2026-11", rule_uid="r1",
                 scope="team=t1")


async def fill(dsn: str) -> None:
    async with AsyncConnectionPool(dsn, kwargs={"autocommit": True,
                                                "row_factory": dict_row}) as pool:
        keys, gov = PostgresKeyStore(pool), PostgresGovernanceStore(pool)
        await keys.create_team(name="t1", limits=TeamLimits(usd_micros_per_day=20_000))
        await keys.put_member("t1", "alice", limits=MemberLimits(usd_micros_per_day=15_000))
        p = await principal(keys, user="alice")
        reqs = {rid: with_charges(request(p, usd=usd, tokens=200, rid=rid),
                                  msgspec.structs.replace(ACCOUNT, amount=usd))
                for rid, usd in (("done", 2_000), ("cut", 2_000), ("cut2", 1_500),
                                 ("open", 3_000))}
        permits = {}
        for rid, req in reqs.items():
            [permit] = await gov.admit([req])
            assert isinstance(permit, Permit), permit
            permits[rid] = permit
        done = settlement(reqs["done"], exact(60, 1_234))
        facts = RequestFacts(route="/v1/chat/completions", deployment="mock", client="curl",
                             http_status=200)
        await gov.settle(permits["done"].id, msgspec.structs.replace(done, facts=facts))
        for rid in ("cut", "cut2"):
            cut = Outcome(kind=OutcomeKind.UNCERTAIN, detail="stream cut")
            await gov.settle(permits[rid].id, settlement_for(reqs[rid], cut))


def main(out: str) -> None:
    server = os.environ["INFERPLANE_TEST_PG_DSN"]
    name = f"ipt_make_010_{os.getpid()}"
    create_database(server, name)
    try:
        dsn = dsn_for(server, name)
        migrate(dsn)
        asyncio.run(fill(dsn))
        dump = subprocess.run(["pg_dump", "--inserts", "--no-owner", "--no-privileges",
                               "--no-comments", dsn], check=True, capture_output=True)
        # psql's \restrict lines (pg_dump >= 15.14) are not SQL: the test runs the dump
        # through psycopg.
        text = b"".join(line for line in dump.stdout.splitlines(keepends=True)
                        if not line.startswith((b"\\restrict", b"\\unrestrict")))
        with open(out, "wb") as f:
            f.write(gzip.compress(text, compresslevel=9, mtime=0))
    finally:
        drop_database(server, name)


if __name__ == "__main__":
    main(sys.argv[1])
