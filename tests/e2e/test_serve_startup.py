"""``mayu serve`` startup checks, as real processes: declared teams and policy files.

Shared profile: ``bootstrap_teams`` are registered through the shared store's immutable
declarations (the first replica creates the team, an identical repeat starts normally
and changes nothing, a different declaration refuses startup with one line naming
``bootstrap_teams[i]``). Any profile: an invalid ``policies:`` set refuses startup with
one line per problem and no traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.e2e._procs import run_cli, start_gateway

pytestmark = pytest.mark.e2e

MODEL = {"name": "gpt-local", "deployments": [{"provider": "in-process"}]}


def _config(tmp_path: Path, name: str, **extra: Any) -> Path:
    config = {"data_dir": str(tmp_path / name), "demo": False,
              "providers": [{"name": "in-process", "kind": "mock"}], "models": [MODEL],
              **extra}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _shared(tmp_path: Path, name: str, teams: list[dict[str, Any]], **extra: Any) -> Path:
    return _config(tmp_path, name, key_store={"type": "postgres"},
                   governance_store={"type": "postgres"}, server={"replica_id": name},
                   database={"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                             "pool_max_size": 2},
                   bootstrap_teams=teams, **extra)


def _teams(dsn: str) -> list[tuple[str, int | None, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT name, rpm, revision FROM teams ORDER BY name").fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def test_shared_bootstrap_teams_are_immutable_declarations(tmp_path: Path,
                                                           pg_dsn: str) -> None:
    """First replica creates the declared teams; an identical declaration starts and
    changes nothing (not even an admin edit); a different one exits with one line."""
    env = {"INFERPLANE_DATABASE_URL": pg_dsn}
    teams = [{"name": "alpha", "rpm": 10}, {"name": "beta", "tpm": 1000}]
    first = start_gateway(_shared(tmp_path, "r1", teams), env=env)
    try:
        assert _teams(pg_dsn) == [("alpha", 10, 1), ("beta", None, 1)]
        edited = run_cli("teams", "set", "alpha", "--rpm", "20", "--config",
                         str(tmp_path / "r1.yaml"), env=env)
        assert edited.returncode == 0, edited.stderr
        second = start_gateway(_shared(tmp_path, "r2", teams), env=env)
        second.stop()
        assert _teams(pg_dsn) == [("alpha", 20, 2), ("beta", None, 1)]

        conflicting = [teams[0], {"name": "beta", "tpm": 2000}]
        done = run_cli("serve", "--config", str(_shared(tmp_path, "r3", conflicting)),
                       "--port", "0", env=env)
        assert done.returncode != 0
        errors = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("mayu: error: bootstrap_teams[1]:")
        assert "Traceback" not in done.stdout + done.stderr
        assert _teams(pg_dsn) == [("alpha", 20, 2), ("beta", None, 1)]
    finally:
        first.stop()


def _invalid_policy(tmp_path: Path) -> str:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "team.yaml").write_text(yaml.safe_dump({
        "apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
        "metadata": {"name": "team"},
        "spec": {"rules": [
            {"name": "daily", "failurePolicy": "FailClosed",
             "subject": {"kind": "team", "team": "t"},
             "budget": {"limitMilliUSD": -1, "window": "day", "hardCap": True}},
            {"name": "rate", "failurePolicy": "FailClosed",
             "subject": {"kind": "team", "team": "t"}, "rate": {"rpm": 0}}]}}))
    return str(policies / "*.yaml")


def test_invalid_policy_set_refuses_startup_one_line_per_problem(tmp_path: Path) -> None:
    """Local profile: two bad fields → exit 2, exactly two error lines naming them."""
    config = _config(tmp_path, "local", policies=[_invalid_policy(tmp_path)])
    done = run_cli("serve", "--config", str(config), "--port", "0")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 2, done.stderr
    assert "spec.rules[0].budget.limitMilliUSD" in errors[0]
    assert "spec.rules[1].rate.rpm" in errors[1]
    assert all(line.startswith("mayu: error: policies: ") for line in errors)
    assert "Traceback" not in done.stdout + done.stderr


def test_shared_profile_refuses_local_policy_files(tmp_path: Path, pg_dsn: str) -> None:
    """Shared profile with ``policies:`` files (a second policy authority) exits with one
    line naming ``policies``."""
    policies = tmp_path / "p"
    policies.mkdir()
    config = _shared(tmp_path, "r1", [], policies=[str(policies / "*.yaml")])
    done = run_cli("serve", "--config", str(config), "--port", "0",
                   env={"INFERPLANE_DATABASE_URL": pg_dsn})
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("mayu: error: policies: ")
