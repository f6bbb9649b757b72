"""The request log (``/admin/v1/requests``) on a million permits, from one run.

Fills a scratch database's ``permits`` with N settled permits (20 teams, 200 keys, 3
models, four client tools, spread over the last 30 days; one in a hundred settled
``uncertain`` with a liability, in runs of 20 as an upstream outage leaves them), as
admission and settlement write them (one ``INSERT … SELECT generate_series``), then
times, through a real shared-profile app (Litestar's in-process client, read admin
token), R repeats of each case (``--only`` picks some, by name):

  team-summary     a team's day summary (``/admin/v1/requests/summary?team=…&since=<day>
                   &until=<day+1>``)
  team-by-tool     the same grouped by client tool (``&group_by=tool``)
  team-page        a team's newest page (``/admin/v1/requests?team=…&limit=100``)
  all-page         the newest page of every request, no filter (``?limit=50``: the
                   console's Requests page as it opens)
  all-next         the page after it (``&cursor=<its next_cursor>``)
  day-page         a day's newest page (``?since=<day>&until=<day+1>&limit=50``)
  model-page       one model's newest page (``?model=gpt-5-mini&limit=50``)
  tool-page        one client tool's newest page (``?tool=codex&limit=50``)
  status-page      one outcome's newest page (``?status=uncertain&limit=50``: 1%)
  pending-page     the pending ones (``?status=pending&limit=50``: none here)
  all-summary      every team's day summary (``/admin/v1/requests/summary?since=<day>
                   &until=<day+1>``, grouped by team)
  team-month       a team's last 30 days by model (``…/summary?team=…&group_by=model
                   &bucket=none&since=<30 days ago>``)
  team-hourly      the same by the hour (``&bucket=hour``: the console's Usage page)
  csv              a CSV export of about 100k rows (``/admin/v1/requests.csv?since=…``
                   chosen to match; R/5 repeats)

and prints p50/p99 of each, plus the permits table's bytes per row (heap + its indexes,
``pg_total_relation_size`` / N). ``--plans`` also prints the plan Postgres picks for
each page case (``EXPLAIN ANALYZE`` of ``request_log`` with the same parameters): its
nodes, and the rows it read::

    .venv/bin/python tests/bench/requestlog.py [--n 1000000] [--repeats 20]
        [--only all-page,day-page] [--plans]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sql  # noqa: E402
from tests.bench._bench import run_on_own_database, shared_client  # noqa: E402

TOKEN = "bench-request-log-read-token"

FILL = """
INSERT INTO permits (id, request_id, key_id, team_id, user_name, model, token_bound,
                     usd_bound, generation, day, month, status, tokens_committed,
                     usd_committed, tokens_liability, usd_liability, admitted_us,
                     created_at, settled_at)
SELECT gen_random_uuid(), 'req_' || i, 'key_' || (i %% 200), 'team_' || (i %% 20),
       'user_' || (i %% 50), (ARRAY['gpt-5', 'claude-opus-4-8', 'gpt-5-mini'])[1 + i %% 3],
       4000, 90000, 0, to_char(t, 'YYYY-MM-DD'), to_char(t, 'YYYY-MM'),
       CASE WHEN uncertain THEN 'uncertain' ELSE 'complete' END,
       1000 + i %% 977, 20000 + i %% 9973, CASE WHEN uncertain THEN 3000 ELSE 0 END,
       CASE WHEN uncertain THEN 70000 ELSE 0 END, 0, t, t + interval '2 seconds'
  FROM generate_series(1, %(n)s) AS i,
       LATERAL (SELECT %(start)s::timestamptz
                       + (i::double precision / %(n)s) * interval '30 days' AS t,
                       (i / 20) %% 100 = 7 AS uncertain) AS at
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


@dataclass(frozen=True)
class Case:
    """One timed call: its name (``--only``), what it is, the path and query."""

    name: str
    label: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)


def cases(now: datetime, n: int) -> Iterator[Case]:
    """Every case, in the order they run (the docstring's list)."""
    day = (now - timedelta(days=3)).replace(hour=0, minute=0, second=0)
    one_day = {"since": day.isoformat(), "until": (day + timedelta(days=1)).isoformat()}
    yield Case("team-summary", "a team's day summary", "/admin/v1/requests/summary",
               {"team": "team_7", **one_day})
    yield Case("team-by-tool", "the same by client tool", "/admin/v1/requests/summary",
               {"team": "team_7", "group_by": "tool", **one_day})
    yield Case("team-page", "a team's newest 100", "/admin/v1/requests",
               {"team": "team_7", "limit": 100})
    yield Case("all-page", "every request, newest 50", "/admin/v1/requests", {"limit": 50})
    yield Case("all-next", "every request, the next 50 (cursor)", "/admin/v1/requests",
               {"limit": 50})  # the cursor is the all-page answer's, set when it runs
    yield Case("day-page", "a day (since/until), newest 50", "/admin/v1/requests",
               {"limit": 50, **one_day})
    yield Case("model-page", "a model (1/3), newest 50", "/admin/v1/requests",
               {"model": "gpt-5-mini", "limit": 50})
    yield Case("tool-page", "a client tool (1/4), newest 50", "/admin/v1/requests",
               {"tool": "codex", "limit": 50})
    yield Case("status-page", "an outcome (uncertain, 1%), newest 50", "/admin/v1/requests",
               {"status": "uncertain", "limit": 50})
    yield Case("pending-page", "the pending (none), newest 50", "/admin/v1/requests",
               {"status": "pending", "limit": 50})
    yield Case("all-summary", "every team's day summary", "/admin/v1/requests/summary",
               one_day)
    yield Case("team-month", "a team's month, by model", "/admin/v1/requests/summary",
               {"team": "team_7", "group_by": "model", "bucket": "none",
                "since": (now - timedelta(days=30)).isoformat()})
    yield Case("team-hourly", "a team's 30 days by the hour and model (the console's Usage)",
               "/admin/v1/requests/summary",
               {"team": "team_7", "group_by": "model", "bucket": "hour",
                "since": (now - timedelta(days=30)).isoformat()})
    yield Case("csv", "CSV export", "/admin/v1/requests.csv",
               {"since": (now - timedelta(days=30 * 100_000 / n)).isoformat()})


NAMES = tuple(case.name for case in cases(datetime.now(UTC), 1_000_000))


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


def _what(case: Case, answer: Any) -> str:
    """What the answer held: requests summed, summary rows, page rows or CSV lines."""
    if case.path.endswith(".csv"):
        return f"{answer.text.count(chr(10)) - 1} rows"
    rows = answer.json()["data"]
    if case.path.endswith("summary"):
        return f"{len(rows)} rows, {sum(r['requests'] for r in rows)} requests"
    return f"{len(rows)} rows"


def _log_params(params: dict[str, Any], cursor: str | None) -> dict[str, Any]:
    """``request_log``'s parameters for a page case, as PostgresGovernanceStore builds
    them (the team's id is its name here: the filled permits name no real team)."""
    before = bytes.fromhex(cursor).decode().split("|", 1) if cursor else None
    return {"team_id": params.get("team"), "key_id": None, "user": None,
            "model": params.get("model"), "status": params.get("status"),
            "client": params.get("tool"), "since": params.get("since"),
            "until": params.get("until"), "before_at": before[0] if before else None,
            "before_id": before[1] if before else None, "limit": params["limit"] + 1}


def _nodes(plan: dict[str, Any], depth: int = 0) -> Iterator[str]:
    read = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
    on = plan.get("Index Name") or plan.get("Relation Name") or ""
    kind = " ".join(filter(None, (plan.get("Join Type"), plan["Node Type"],
                                  "Backward" if plan.get("Scan Direction") == "Backward"
                                  else None)))
    yield (f"{'  ' * depth}{kind}{' ' + on if on else ''}"
           f" ({plan.get('Actual Rows', 0):.0f} rows, {read:.0f} read, "
           f"{plan.get('Actual Loops', 1)} loops)")
    for child in plan.get("Plans", []):
        yield from _nodes(child, depth + 1)


def explain(dsn: str, params: dict[str, Any]) -> str:
    """The plan of ``request_log`` with these parameters, run (EXPLAIN ANALYZE)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) "
                           + sql.queries["request_log"].encode(), params).fetchone()
    assert row is not None
    top = row[0][0]
    return "\n".join([*_nodes(top["Plan"]), f"execution {top['Execution Time']:.1f} ms"])


async def run(dsn: str, n: int, repeats: int, only: set[str], plans: bool) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    fill(dsn, n, now - timedelta(days=30))
    async with shared_client(dsn, {"bench": ("read", TOKEN)}, statement_timeout_s=60,
                             timeout=120) as client:
        cursor = None
        for case in cases(now, n):
            params = case.params
            if case.name == "all-next":
                if cursor is None:
                    _, first = await _time(client, "/admin/v1/requests",
                                           {"limit": 50}, 1)
                    cursor = first.json()["next_cursor"]
                params = {**params, "cursor": cursor}
            if case.name not in only:
                continue
            spent, answer = await _time(client, case.path, params,
                                        max(1, repeats // 5) if case.name == "csv"
                                        else repeats)
            if case.name == "all-page":
                cursor = answer.json()["next_cursor"]
            unit, scale = ("s", 1.0) if case.name == "csv" else ("ms", 1000.0)
            digits = 2 if case.name == "csv" else 0
            print(f"{case.name}: {case.label} ({_what(case, answer)}): "
                  f"p50 {statistics.median(spent) * scale:.{digits}f} {unit}, "
                  f"p99 {_pct(spent, .99) * scale:.{digits}f} {unit}", flush=True)
            if plans and case.path == "/admin/v1/requests":
                print("  " + explain(dsn, _log_params(params, params.get("cursor")))
                      .replace("\n", "\n  "), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="permits to fill (1000000)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per query (20)")
    ap.add_argument("--only", default=",".join(NAMES),
                    help="comma-separated cases to time (all of them)")
    ap.add_argument("--plans", action="store_true",
                    help="print each page case's plan (EXPLAIN ANALYZE of request_log)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if unknown := only - set(NAMES):
        ap.error(f"--only: no such case {', '.join(sorted(unknown))} "
                 f"(cases: {', '.join(NAMES)})")
    run_on_own_database("bench_reqlog",
                        lambda dsn: run(dsn, args.n, args.repeats, only, args.plans))


if __name__ == "__main__":
    main()
