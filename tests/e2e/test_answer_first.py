"""Answer first (``server.settle_wait_s`` 0, the default), shared profile, real processes.

The store's taking of a settlement is held by a trigger that waits on an advisory lock
the test holds, so "the answer left before the store took it" is shown by order, not by
timing: the client has its whole answer (JSON through the ``openai`` SDK, a stream through
the ``anthropic`` SDK) while the permit is still pending in the database. Meanwhile the
reservation binds; once the lock is released the store commits exactly the cost the
answer carried. A replica SIGKILLed in between settles it from its journal at restart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psycopg
import pytest
import yaml

from tests.e2e._procs import Proc, shared_stores, start_gateway, team_and_key
from tests.e2e.conftest import PRICE

pytestmark = pytest.mark.e2e

LOCK = 4242
BUDGET = 10_000_000


def _sql(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "af.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "af"), "demo": False,
        "server": {"replica_id": "af"},  # settle_wait_s: the default
        **shared_stores(pool_min_size=1, pool_max_size=4),
        "providers": [{"name": "mock", "kind": "mock"}],
        "models": [{"name": "m", "price": PRICE, "deployments": [
                       {"provider": "mock", "upstream_model": "mock-gpt"}]},
                   {"name": "c", "price": PRICE, "deployments": [
                       {"provider": "mock", "upstream_model": "mock-claude"}]}]}))
    return path


def _team_key(config: Path, dsn: str) -> tuple[str, str]:
    return team_and_key(config, "af", "--usd-micros-per-day", str(BUDGET),
                        env={"INFERPLANE_DATABASE_URL": dsn})


@contextmanager
def _settlements_held(dsn: str) -> Iterator[None]:
    """While inside, a permit's settlement waits in the database (its row update blocks
    on an advisory lock this connection holds); leaving releases it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))


def _hold_settlements_in_trigger(dsn: str) -> None:
    _sql(dsn, "CREATE FUNCTION e2e_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
              f"IF NEW.status <> 'pending' THEN PERFORM pg_advisory_lock_shared({LOCK}); "
              f"PERFORM pg_advisory_unlock_shared({LOCK}); END IF; RETURN NEW; END $$")
    _sql(dsn, "CREATE TRIGGER e2e_hold BEFORE UPDATE ON permits FOR EACH ROW "
              "EXECUTE FUNCTION e2e_hold()")


def _permit(dsn: str, permit_id: str) -> tuple[str, int, int]:
    [(status, committed, liability)] = _sql(
        dsn, "SELECT status, coalesce(usd_committed, 0), coalesce(usd_liability, 0)"
            " FROM permits WHERE id = %s",
        permit_id)
    return status, int(committed), int(liability)


def _usd_day(dsn: str, team_id: str) -> tuple[int, int]:
    """(committed, reserved) of the team's µUSD day window, from the database."""
    [(committed, reserved)] = _sql(
        dsn, "SELECT coalesce(sum(committed), 0), coalesce(sum(reserved), 0) FROM counters"
             " WHERE key LIKE %s", f"team:{team_id}:usd:day:%")
    return int(committed), int(reserved)


def _usage(gw: Proc, key: str) -> tuple[int, int]:
    """(µUSD committed, µUSD reserved) of the team's day row of ``GET /v1/usage``."""
    body = httpx.get(f"{gw.url}/v1/usage", headers={"Authorization": f"Bearer {key}"},
                     timeout=30).json()
    [row] = [r for r in body["data"] if r["scope"] == "team" and r["window"] == "day"]
    return int(row["usd_committed"]), int(row["usd_reserved"])


def _chat(gw: Proc, key: str) -> tuple[str, int, int]:
    """One JSON answer through the openai SDK: (permit, its cost, its µUSD bound)."""
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", max_tokens=64, messages=[{"role": "user", "content": "hello there"}])
    answer = raw.parse()
    assert answer.choices[0].message.content and answer.usage is not None
    return (raw.headers["x-inferplane-permit"],
            int(raw.headers["x-inferplane-cost-micro-usd"]),
            int(raw.headers["x-inferplane-usd-bound"]))


def test_the_answer_leaves_before_the_store_takes_it_and_binds_until_then(
        tmp_path: Path, pg_dsn: str) -> None:
    """A JSON answer and a whole stream reach their SDK clients while their settlements
    are held in the database: meanwhile each permit is pending and its bound reserved (the
    usage report says reserved, never a figure the store lacks); released, the store
    commits exactly the cost each answer carried, nothing stays reserved."""
    _hold_settlements_in_trigger(pg_dsn)
    config = _config(tmp_path)
    team_id, key = _team_key(config, pg_dsn)
    gw = start_gateway(config, env={"INFERPLANE_DATABASE_URL": pg_dsn})
    try:
        with _settlements_held(pg_dsn):
            permit, cost, bound = _chat(gw, key)
            assert cost > 0
            assert _permit(pg_dsn, permit) == ("pending", 0, 0)
            assert _usd_day(pg_dsn, team_id) == (0, bound)
            # The report waits its 1 s for the held settlement, then reads the store.
            assert _usage(gw, key) == (0, bound)
        assert _usage(gw, key) == (cost, 0)
        assert _permit(pg_dsn, permit) == ("complete", cost, 0)
        assert _usd_day(pg_dsn, team_id) == (cost, 0)

        client = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
        with _settlements_held(pg_dsn):
            with client.messages.stream(model="c", max_tokens=64, messages=[
                    {"role": "user", "content": "stream to me"}]) as stream:
                final = stream.get_final_message()
                permit = stream.response.headers["x-inferplane-permit"]
            assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
            assert _permit(pg_dsn, permit)[0] == "pending"
            [line] = [a for a in map(json.loads, (tmp_path / "af" / "audit-af.jsonl")
                                     .read_text().splitlines())
                      if a.get("permit") == permit and a["event"] == "settled"]
            assert line["stored"] is False and line["outcome"] == "complete"
        assert _usage(gw, key) == (cost + line["usd_committed"], 0)
        assert _permit(pg_dsn, permit) == ("complete", line["usd_committed"], 0)
    finally:
        gw.stop()


def test_a_replica_killed_between_answer_and_store_settles_it_from_its_journal(
        tmp_path: Path, pg_dsn: str) -> None:
    """SIGKILL after the client got its answer, before the store took the settlement
    (its transaction is rolled back with the dead replica's connections): the permit
    stays pending and binding, and the replica restarted on its data dir settles it from
    the journal with exactly the cost the answer carried."""
    _hold_settlements_in_trigger(pg_dsn)
    config = _config(tmp_path)
    team_id, key = _team_key(config, pg_dsn)
    env = {"INFERPLANE_DATABASE_URL": pg_dsn}
    gw = start_gateway(config, env=env)
    try:
        with _settlements_held(pg_dsn):
            permit, cost, bound = _chat(gw, key)
            gw.popen.kill()
            gw.popen.wait(timeout=10)
            _sql(pg_dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                         " AND application_name <> ''")
        assert _permit(pg_dsn, permit) == ("pending", 0, 0)
        assert _usd_day(pg_dsn, team_id) == (0, bound)
    finally:
        gw.stop()
    gw = start_gateway(config, env=env)  # serves once the journal's permits are resolved
    try:
        assert _permit(pg_dsn, permit) == ("complete", cost, 0)
        assert _usd_day(pg_dsn, team_id) == (cost, 0)
        replayed = [a for a in map(json.loads, (tmp_path / "af" / "audit-af.jsonl")
                                   .read_text().splitlines())
                    if a.get("permit") == permit and a["event"] == "settlement_replayed"]
        assert [r["usd_committed"] for r in replayed] == [cost]
    finally:
        gw.stop()
