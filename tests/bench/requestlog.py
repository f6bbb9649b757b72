"""The request log (``/admin/v1/requests``) on a million permits, from one run.

Fills a scratch database's ``permits`` with N settled permits (20 teams, 200 keys, 3
models, spread over the last 30 days, as admission and settlement write them: one
``INSERT … SELECT generate_series``), then times, through a real shared-profile app
(Litestar's in-process client, read admin token), R repeats of:

- a team's day summary (``/admin/v1/requests/summary?team=…&since=<day>&until=<day+1>``),
  and the same grouped by client tool;
- a filtered page (``/admin/v1/requests?team=…&limit=100``, newest first);
- a CSV export of about 100k rows (``/admin/v1/requests.csv?since=…`` chosen to match);

and prints p50/p99 of each, plus the permits table's bytes per row (heap + its indexes,
``pg_total_relation_size`` / N)::

    .venv/bin/python tests/bench/requestlog.py [--n 1000000] [--repeats 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from msgspec.structs import replace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.app import create_app  # noqa: E402
from gateway.config import (  # noqa: E402
    AdminToken,
    DatabaseSettings,
    GovernanceStoreSettings,
    KeyStoreSettings,
    load_settings,
)
from tests.bench._bench import own_database  # noqa: E402

TOKEN = "bench-request-log-read-token"

FILL = """
INSERT INTO permits (id, request_id, key_id, team_id, user_name, model, token_bound,
                     usd_bound, generation, day, month, status, tokens_committed,
                     usd_committed, tokens_liability, usd_liability, admitted_us,
                     created_at, settled_at)
SELECT gen_random_uuid(), 'req_' || i, 'key_' || (i %% 200), 'team_' || (i %% 20),
       'user_' || (i %% 50), (ARRAY['gpt-5', 'claude-opus-4-8', 'gpt-5-mini'])[1 + i %% 3],
       4000, 90000, 0, to_char(t, 'YYYY-MM-DD'), to_char(t, 'YYYY-MM'), 'complete',
       1000 + i %% 977, 20000 + i %% 9973, 0, 0, 0, t, t + interval '2 seconds'
  FROM generate_series(1, %(n)s) AS i,
       LATERAL (SELECT %(start)s::timestamptz
                       + (i::double precision / %(n)s) * interval '30 days' AS t) AS at
"""


FACTS = """
INSERT INTO permit_facts
SELECT id, (ARRAY['/v1/messages', '/v1/responses', '/v1/chat/completions'])[1 + n % 3],
       'up/' || model,
       (ARRAY['claude-code', 'codex', 'openai-python', 'anthropic-python'])[1 + (n / 20) % 4],
       200, tokens_committed / 4, 60, tokens_committed / 2, tokens_committed / 4, 0, 0
  FROM (SELECT *, row_number() OVER () AS n FROM permits) AS p
"""


def fill(dsn: str, n: int, start: datetime) -> None:
    """``n`` settled permits spread over the 30 days from ``start``, each with its
    request-log facts (also used by tests/bench/console.py); prints the time and the
    tables' bytes per permit."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        t = time.perf_counter()
        conn.execute(FILL, {"n": n, "start": start})  # type: ignore[arg-type]
        conn.execute(FACTS)  # type: ignore[arg-type]  # no parameters: % is modulo
        conn.execute("ANALYZE permits")
        conn.execute("ANALYZE permit_facts")
        fill_s = time.perf_counter() - t
        size = conn.execute("SELECT pg_total_relation_size('permits'), "
                            "pg_relation_size('permits'), "
                            "pg_total_relation_size('permit_facts')").fetchone()
    assert size is not None
    print(f"filled {n} permits in {fill_s:.1f} s; permits: {size[0] / n:.0f} bytes per "
          f"row with its indexes ({size[1] / n:.0f} heap); their facts (permit_facts) "
          f"{size[2] / n:.0f} more")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _time(client: Any, path: str, params: dict[str, Any], repeats: int,
                ) -> tuple[list[float], Any]:
    spent, last = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        last = await client.get(path, params=params,
                                headers={"Authorization": f"Bearer {TOKEN}"})
        spent.append(time.perf_counter() - t)
        assert last.status_code == 200, last.text[:300]
    return spent, last


async def run(dsn: str, n: int, repeats: int) -> None:
    from litestar.testing import AsyncTestClient

    now = datetime.now(UTC).replace(microsecond=0)
    fill(dsn, n, now - timedelta(days=30))

    os.environ["INFERPLANE_DATABASE_URL"] = dsn
    os.environ["IPT_BENCH_ADMIN"] = TOKEN
    base = load_settings(None)
    with tempfile.TemporaryDirectory() as work:
        server = replace(base.server, admin_tokens=[
            AdminToken(name="bench", token_ref="env:IPT_BENCH_ADMIN")])
        settings = replace(base, data_dir=work, demo=False, server=server,
                           key_store=KeyStoreSettings(type="postgres"),
                           governance_store=GovernanceStoreSettings(type="postgres"),
                           database=DatabaseSettings(pool_min_size=1, pool_max_size=4,
                                                     statement_timeout_s=60))
        async with AsyncTestClient(app=create_app(settings), timeout=120) as client:
            day = (now - timedelta(days=3)).replace(hour=0, minute=0, second=0)
            summary, answer = await _time(client, "/admin/v1/requests/summary", {
                "team": "team_7", "since": day.isoformat(),
                "until": (day + timedelta(days=1)).isoformat()}, repeats)
            rows = answer.json()["data"]
            by_tool, answer = await _time(client, "/admin/v1/requests/summary", {
                "team": "team_7", "group_by": "tool", "since": day.isoformat(),
                "until": (day + timedelta(days=1)).isoformat()}, repeats)
            tools = len(answer.json()["data"])
            page, _ = await _time(client, "/admin/v1/requests",
                                  {"team": "team_7", "limit": 100}, repeats)
            since = now - timedelta(days=30 * 100_000 / n)
            export, answer = await _time(client, "/admin/v1/requests.csv",
                                         {"since": since.isoformat()}, max(1, repeats // 5))
            exported = answer.text.count("\n") - 1
    print(f"team day summary ({rows[0]['requests'] if rows else 0} requests): "
          f"p50 {statistics.median(summary) * 1000:.0f} ms, p99 {_pct(summary, .99) * 1000:.0f} ms")
    print(f"the same by client tool ({tools} tools): p50 "
          f"{statistics.median(by_tool) * 1000:.0f} ms, p99 {_pct(by_tool, .99) * 1000:.0f} ms")
    print(f"filtered page (team, newest 100): p50 {statistics.median(page) * 1000:.0f} ms, "
          f"p99 {_pct(page, .99) * 1000:.0f} ms")
    print(f"CSV export ({exported} rows): p50 {statistics.median(export):.2f} s, "
          f"p99 {_pct(export, .99):.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="permits to fill (1000000)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per query (20)")
    args = ap.parse_args()
    with own_database("bench_reqlog") as dsn:
        asyncio.run(run(dsn, args.n, args.repeats))


if __name__ == "__main__":
    main()
