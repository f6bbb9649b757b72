"""Which ``database.admission_coalesce`` to default to (script, not a test).

Paired A/B runs through ``PostgresGovernanceStore`` on one migrated database: N
concurrent workers loop over admit + settle for a fixed time, for one hot team and for
100 spread teams, with each coalescing setting run back to back, several rounds. The
machine is shared and noisy, so compare the settings within one round (adjacent runs),
and look at how often one wins, not at absolute figures.

    .venv/bin/python tests/bench/coalesce.py --rounds 4 --seconds 3 --settings 0 1 2

Uses ``INFERPLANE_TEST_PG_DSN`` (default the local server) to create and drop its own
database ``ipcoal_<pid>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import PostgresGovernanceStore  # noqa: E402
from tests.bench._bench import run_on_own_database  # noqa: E402
from tests.bench.admission import Run, _admit_settle, _drive, _principals  # noqa: E402


async def bench(dsn: str, args: argparse.Namespace) -> dict[tuple[str, int], list[float]]:
    rates: dict[tuple[str, int], list[float]] = {}
    async with AsyncConnectionPool(dsn, min_size=args.workers, max_size=args.workers,
                                   kwargs={"autocommit": True}) as pool:
        principals = await _principals(pool, 100)
        loads = (("hot", lambda w: principals[0]),
                 ("spread", lambda w: principals[w % 100]))
        for r in range(args.rounds):
            for load, pick in loads:
                for setting in args.settings:
                    gov = PostgresGovernanceStore(pool, coalesce=setting)
                    errors: dict[str, int] = {}
                    run: Run = await _drive(f"round {r} {load:6s} coalesce={setting}",
                                            args.workers, args.seconds,
                                            _admit_settle(gov, pick, 1, errors))
                    run.errors.update(errors)
                    print(run.line(), flush=True)
                    rates.setdefault((load, setting), []).append(run.rate)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--settings", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    rates = run_on_own_database("ipcoal", lambda dsn: bench(dsn, args))
    base = args.settings[0]
    for load in ("hot", "spread"):
        for setting in args.settings[1:]:
            ratios = [b / a for a, b in zip(rates[(load, base)], rates[(load, setting)],
                                            strict=True) if a]
            wins = sum(x > 1 for x in ratios)
            print(f"{load:6s} coalesce={setting} vs {base}: median ratio "
                  f"{statistics.median(ratios):.2f}, better in {wins}/{len(ratios)} rounds")


if __name__ == "__main__":
    main()
