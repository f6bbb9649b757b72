"""The admission and settlement SQL functions, this release's ``_v2`` against the
baseline's ``_v1``, on ONE database in one run (a script, not a test).

Both versions are installed at head (the ``_v1`` entry points stay one release for
rolling updates, ``migrations/versions/0003_functions_v2.py``), so the same requests of
the same team go through either, alternately (``v1, v2, v2, v1, ...``): the machine's load
falls on both alike. Each step is one admission of one request, then its settlement with
the request log's facts — ``_v1`` as the previous release's gateway sent it (the facts
inserted by a CTE of the settle statement, the text taken from the baseline commit's
``sql/queries.sql``), ``_v2`` as this one does (the facts handed to the function).

Prints, per version, the median and p90 of the client-timed call (c=1, one connection,
autocommit) and of the server's own time in the function (``pg_stat_user_functions``
with ``track_functions = 'pl'``: no network, no parse), and the ratios v2/v1.

    .venv/bin/python tests/bench/functions.py [--rounds 7] [--calls 300] [--base 326c719]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import psycopg
from psycopg_pool import AsyncConnectionPool

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gateway.governance import build_request  # noqa: E402
from gateway.governance._postgres import _facts_json, _settlement_json  # noqa: E402
from gateway.keys import TeamLimits  # noqa: E402
from gateway.policy import EMPTY_SNAPSHOT  # noqa: E402
from gateway.pricing import Usage  # noqa: E402
from tests.bench._bench import machine_ms, own_database, team_principal  # noqa: E402
from tests.settling import exact, settlement  # noqa: E402

LIMITS = TeamLimits(rpm=1 << 30, tpm=1 << 35, tokens_per_day=1 << 49,
                    usd_micros_per_day=1 << 49)
V2_ADMIT = "SELECT inferplane_admit_one_v2(%(requests)s::jsonb) AS results"
V2_SETTLE = ("SELECT inferplane_settle_one_v2(%(permit_id)s::uuid, %(settlement)s::jsonb, "
             "%(facts)s::jsonb) AS result")
V1_ADMIT = "SELECT inferplane_admit_one_v1(%(requests)s::jsonb) AS results"


def base_query(base: str, name: str) -> str:
    """The named query of the baseline commit's ``sql/queries.sql``."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{base}:sql/queries.sql"],
                          check=True, capture_output=True, text=True).stdout
    blocks = text.split("-- name: ")
    for block in blocks[1:]:
        head, _, body = block.partition("\n")
        if head.strip() == name:
            lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
            return "\n".join(lines).strip()
    raise SystemExit(f"no query {name!r} in {base}:sql/queries.sql")


class Side:
    def __init__(self, name: str, admit: str, settle: str, functions: tuple[str, str]):
        self.name, self.admit, self.settle, self.functions = name, admit, settle, functions
        self.client: dict[str, list[float]] = {"admit": [], "settle": []}
        self.server: dict[str, list[float]] = {"admit": [], "settle": []}


def _stats(conn: psycopg.Connection[Any], names: tuple[str, ...]) -> dict[str, tuple[int, float]]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute("SELECT funcname, calls, total_time FROM pg_stat_user_functions "
                        "WHERE funcname = ANY(%s)", (list(names),)).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


async def _setup(dsn: str) -> Any:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False) as pool:
        return await team_principal(pool, "bench", LIMITS)


def run_side(conn: psycopg.Connection[Any], side: Side, principal: Any, calls: int,
             round_no: int) -> None:
    names = side.functions
    before = _stats(conn, names)
    admit_t, settle_t = [], []
    for i in range(calls):
        req = build_request(principal, EMPTY_SNAPSHOT, request_id=f"{side.name}-{round_no}-{i}",
                            model="m", token_bound=500, usd_bound=2_000, now=datetime.now(UTC))
        t0 = time.perf_counter()
        row = conn.execute(side.admit, {"requests": msgspec.json.encode([req]).decode()}
                           ).fetchone()
        t1 = time.perf_counter()
        assert row is not None
        answer = row[0][0]
        permit_id = answer.get("permit_id") or answer.get("id")
        assert permit_id, answer
        s = settlement(req, exact(Usage(input=300, output=100).total_tokens(), 1_234))
        params = {"permit_id": permit_id, "settlement": _settlement_json(s),
                  "facts": _facts_json([(permit_id, s)])}
        t2 = time.perf_counter()
        conn.execute(side.settle, params).fetchone()
        t3 = time.perf_counter()
        admit_t.append(t1 - t0)
        settle_t.append(t3 - t2)
    after = _stats(conn, names)
    side.client["admit"].append(statistics.median(admit_t) * 1e3)
    side.client["settle"].append(statistics.median(settle_t) * 1e3)
    for step, fn in zip(("admit", "settle"), names, strict=True):
        c0, t0_ = before.get(fn, (0, 0.0))
        c1, t1_ = after.get(fn, (0, 0.0))
        if c1 > c0:
            side.server[step].append((t1_ - t0_) / (c1 - c0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=300, help="admit+settle steps per side and round")
    ap.add_argument("--base", default="326c719", help="the commit whose settle_one text _v1 uses")
    ap.add_argument("--no-track", action="store_true",
                    help="leave track_functions off (its own cost grows with nested calls)")
    args = ap.parse_args()
    v1 = Side("v1", V1_ADMIT, base_query(args.base, "settle_one"),
              ("inferplane_admit_one_v1", "inferplane_settle_one_v1"))
    v2 = Side("v2", V2_ADMIT, V2_SETTLE, ("inferplane_admit_one_v2", "inferplane_settle_one_v2"))
    speed0 = machine_ms()
    with own_database("ipfn") as dsn:
        principal = asyncio.run(_setup(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            if not args.no_track:
                conn.execute("SET track_functions = 'pl'")
            for side in (v1, v2):  # warm the plan caches, not measured
                run_side(conn, Side(side.name, side.admit, side.settle, side.functions),
                         principal, 50, -1)
            for r in range(args.rounds):
                for side in ((v1, v2) if r % 2 == 0 else (v2, v1)):
                    run_side(conn, side, principal, args.calls, r)
    print(f"{args.rounds} rounds x {args.calls} admit+settle steps per version, c=1, one "
          f"database; machine {speed0:.0f} -> {machine_ms():.0f} ms (pure-Python loop)")
    print(f"{'':<8}{'admit client':>14}{'admit server':>14}{'settle client':>15}"
          f"{'settle server':>15}   (medians over rounds, ms)")
    med: dict[str, dict[str, float]] = {}
    for side in (v1, v2):
        med[side.name] = {f"{k} {w}": statistics.median(v[k]) if v[k] else float("nan")
                          for w, v in (("client", side.client), ("server", side.server))
                          for k in ("admit", "settle")}
        m = med[side.name]
        print(f"{side.name:<8}{m['admit client']:>14.3f}{m['admit server']:>14.3f}"
              f"{m['settle client']:>15.3f}{m['settle server']:>15.3f}")
    ratio = {k: med["v2"][k] / med["v1"][k] for k in med["v1"]}
    print(f"{'v2/v1':<8}{ratio['admit client']:>14.3f}{ratio['admit server']:>14.3f}"
          f"{ratio['settle client']:>15.3f}{ratio['settle server']:>15.3f}")
    wins = sum(1 for a, b in zip(v2.client["admit"], v1.client["admit"], strict=True) if a <= b)
    print(f"v2's admission at most v1's in {wins}/{args.rounds} rounds (client-timed)")


if __name__ == "__main__":
    main()
