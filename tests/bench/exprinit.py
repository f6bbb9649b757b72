"""What a PL/pgSQL function's distinct expressions cost per transaction (a script, not a
test).

PL/pgSQL builds the executor state of each *simple* expression (an assignment, an ``IF``
condition, an argument) once per transaction, on its first use there, and reuses it for
the rest of that transaction. Every admission and settlement call is its own transaction
(autocommit), so each call pays that set-up again for every distinct expression it
reaches, whatever the batch size: a fixed cost per call that batching amortises and
that a function with fewer, larger expressions pays less of.

Two throwaway functions on this script's own database, each called ``--calls`` times,
once in autocommit (a transaction per call, as the gateway calls) and once inside one
transaction:

- ``K distinct``: K assignments ``x := x + i * y`` written out (K distinct expressions);
- ``one in a loop``: the same assignment in a ``FOR`` loop run K times (one expression);
- ``a SELECT looped``: a one-row indexed ``SELECT ... INTO`` run K times in a loop: what
  one execution of a small SQL statement costs inside a function (executor start-up,
  relation locks, run and shut-down), against the loop of one expression.

The difference between the two modes of ``K distinct`` divided by K is the set-up of one
expression; ``one in a loop`` shows the evaluations themselves cost little.

    .venv/bin/python tests/bench/exprinit.py [--exprs 200] [--calls 3000]

Uses ``INFERPLANE_TEST_PG_DSN`` to create and drop its own database.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._bench import server_dsn  # noqa: E402
from tests.conftest import create_database, drop_database, dsn_for  # noqa: E402


def _functions(k: int) -> str:
    body = "\n".join(f"    x := x + {i} * y;" for i in range(k))
    return f"""
CREATE FUNCTION distinct_exprs(y int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE x bigint := 0;
BEGIN
{body}
    RETURN x;
END $$;
CREATE FUNCTION one_expr(y int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE x bigint := 0;
BEGIN
    FOR i IN 0..{k - 1} LOOP
        x := x + i * y;
    END LOOP;
    RETURN x;
END $$;
CREATE TABLE tiny (id int PRIMARY KEY, v bigint NOT NULL);
INSERT INTO tiny VALUES (3, 1);
CREATE FUNCTION one_stmt(y int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE x bigint := 0;
BEGIN
    FOR i IN 0..{k - 1} LOOP
        SELECT x + t.v INTO x FROM tiny t WHERE t.id = y;
    END LOOP;
    RETURN x;
END $$;
"""


def _per_call_us(conn: psycopg.Connection, fn: str, calls: int, one_transaction: bool) -> float:
    for _ in range(200):  # compiled, plans cached
        conn.execute(f"SELECT {fn}(3)")
    if one_transaction:
        conn.execute("BEGIN")
    t0 = time.perf_counter()
    for _ in range(calls):
        conn.execute(f"SELECT {fn}(3)")
    elapsed = time.perf_counter() - t0
    if one_transaction:
        conn.execute("COMMIT")
    return elapsed / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exprs", type=int, default=200, help="K")
    ap.add_argument("--calls", type=int, default=3000)
    a = ap.parse_args()
    server, name = server_dsn(), "ipexprinit"
    create_database(server, name)
    try:
        with psycopg.connect(dsn_for(server, name), autocommit=True) as conn:
            conn.execute(_functions(a.exprs))
            print(f"{'function':<16} {'a transaction per call':>23} {'one transaction':>16}"
                  "   (µs per call, the round trip included)")
            figures: dict[str, float] = {}
            totals: dict[str, float] = {}
            for fn, label in (("distinct_exprs", f"{a.exprs} distinct"),
                              ("one_expr", "one in a loop"),
                              ("one_stmt", "a SELECT looped")):
                own = _per_call_us(conn, fn, a.calls, one_transaction=False)
                shared = _per_call_us(conn, fn, a.calls, one_transaction=True)
                figures[fn] = own - shared
                totals[fn] = own
                print(f"{label:<16} {own:23.1f} {shared:16.1f}")
        print(f"set-up of one distinct expression per transaction: "
              f"{figures['distinct_exprs'] / a.exprs:.2f} µs")
        print(f"one execution of a one-row indexed SELECT inside PL/pgSQL: "
              f"{(totals['one_stmt'] - totals['one_expr']) / a.exprs:.2f} µs")
    finally:
        drop_database(server, name)


if __name__ == "__main__":
    main()
