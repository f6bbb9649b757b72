"""What the benches share: a scratch database of their own, a client of a shared-profile app
on it, a team with a key on it, a batch of its requests and their exact settlements, and a
process's CPU time."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from msgspec.structs import replace
from psycopg_pool import AsyncConnectionPool

from gateway.app import create_app
from gateway.config import (
    AdminToken,
    DatabaseSettings,
    GovernanceStoreSettings,
    KeyStoreSettings,
    load_settings,
)
from gateway.governance import AdmissionRequest, Permit, Settlement, build_request
from gateway.keys import PostgresKeyStore, Principal, TeamLimits, hash_key
from gateway.policy import EMPTY_SNAPSHOT
from tests.conftest import DEFAULT_DSN, create_database, drop_database, dsn_for, migrate
from tests.settling import exact, settlement

if TYPE_CHECKING:
    from litestar.testing import AsyncTestClient

T = TypeVar("T")


def server_dsn() -> str:
    """The Postgres server the benches use: ``INFERPLANE_TEST_PG_DSN``, else the local one."""
    return os.environ.get("INFERPLANE_TEST_PG_DSN", DEFAULT_DSN)


@contextmanager
def own_database(prefix: str) -> Iterator[str]:
    """A new database on :func:`server_dsn`'s server, migrated to head; dropped after."""
    server, name = server_dsn(), f"{prefix}_{os.getpid()}"
    create_database(server, name)
    try:
        dsn = dsn_for(server, name)
        migrate(dsn)
        yield dsn
    finally:
        drop_database(server, name)


def run_on_own_database(prefix: str, bench: Callable[[str], Coroutine[Any, Any, T]]) -> T:
    """``bench(dsn)`` run to its end on a database of its own (:func:`own_database`)."""
    with own_database(prefix) as dsn:
        return asyncio.run(bench(dsn))


@asynccontextmanager
async def shared_client(dsn: str, tokens: dict[str, tuple[Literal["read", "write"], str]], *,
                        statement_timeout_s: float, timeout: float
                        ) -> AsyncIterator[AsyncTestClient[Any]]:
    """A client (Litestar's in-process one, ``timeout`` s) of a real shared-profile app on
    ``dsn``, the built-in mock models, a scratch data dir and the admin ``tokens`` (name ->
    (access, secret))."""
    from litestar.testing import AsyncTestClient

    os.environ["INFERPLANE_DATABASE_URL"] = dsn
    admin_tokens = []
    for i, (name, (access, secret)) in enumerate(tokens.items()):
        os.environ[f"IPT_BENCH_TOKEN_{i}"] = secret
        admin_tokens.append(AdminToken(name=name, token_ref=f"env:IPT_BENCH_TOKEN_{i}",
                                       access=access))
    base = load_settings(None)
    with tempfile.TemporaryDirectory() as work:
        settings = replace(base, data_dir=work, demo=False,
                           server=replace(base.server, admin_tokens=admin_tokens),
                           key_store=KeyStoreSettings(type="postgres"),
                           governance_store=GovernanceStoreSettings(type="postgres"),
                           database=DatabaseSettings(pool_min_size=1, pool_max_size=4,
                                                     statement_timeout_s=statement_timeout_s))
        async with AsyncTestClient(app=create_app(settings), timeout=timeout) as client:
            yield client


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc``; 0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_ms() -> float:
    """How fast this machine runs now: the median CPU time (ms) of a fixed pure-Python
    loop, three tries. Shared machines swing by half or more between runs, and not
    every kind of work slows alike (docs/benchmarks.md, "How to read them"), so a run's figures
    compare with another run's only next to this one."""
    times = []
    for _ in range(3):
        t0 = time.process_time()
        sum(range(3_000_000))
        times.append(time.process_time() - t0)
    return sorted(times)[1] * 1e3


async def team_principal(pool: AsyncConnectionPool, name: str, limits: TeamLimits) -> Principal:
    """A new team ``name`` with ``limits`` and a key on it: the key's Principal, resolved as
    a gateway resolves it."""
    keys = PostgresKeyStore(pool)
    await keys.create_team(name=name, limits=limits)
    plaintext, _ = await keys.create_key(team=name)
    principal = await keys.resolve(hash_key(plaintext))
    assert principal is not None
    return principal


def batch_requests(principal: Principal, now: datetime, n: int) -> list[AdmissionRequest]:
    """``n`` requests of the principal's team (500 tokens, 2,000 µUSD bound each)."""
    return [build_request(principal, EMPTY_SNAPSHOT, request_id=f"r{j}", model="m",
                          token_bound=500, usd_bound=2_000, now=now) for j in range(n)]


def exact_settlements(permits: list[Permit]) -> list[tuple[str, Settlement]]:
    """Each permit settled complete at 400 tokens and 1,234 µUSD."""
    return [(p.id, settlement(p.request, exact(400, 1_234))) for p in permits]
