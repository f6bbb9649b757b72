"""``mayu migrate`` and the startup schema check, against a real Postgres.

``mayu migrate`` takes the database from ``--config`` (``database.dsn_ref``) or
``INFERPLANE_DATABASE_URL``, prints a line per applied revision and is idempotent; two
at once serialise on an advisory lock. A database behind, empty or ahead of the code
is refused by ``inferplaned serve`` (and ``mayu serve``: test_config_check) in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from gateway.schema import code_heads, schema_problem

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run(module: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full.pop("INFERPLANE_DATABASE_URL", None)
    full.update(env)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def _heads(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]


def test_migrate_uses_the_configs_dsn_and_is_idempotent(tmp_path: Path,
                                                        pg_empty_dsn: str) -> None:
    """--config's database.dsn_ref names the database; one line per revision; a second
    run applies nothing and says the database is already current."""
    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:IPT_MIGRATE_DSN"}}))
    first = run("gateway", "migrate", "--config", str(config), cwd=tmp_path,
                IPT_MIGRATE_DSN=pg_empty_dsn)
    assert first.returncode == 0, first.stderr
    applied = [line for line in first.stdout.splitlines() if " applied " in line]
    assert applied and "base -> v010_baseline" in applied[0]
    assert len(applied) == len(set(applied)) >= len(code_heads())
    assert _heads(pg_empty_dsn) == list(code_heads())
    second = run("gateway", "migrate", "--config", str(config), cwd=tmp_path,
                 IPT_MIGRATE_DSN=pg_empty_dsn)
    assert second.returncode == 0, second.stderr
    assert " applied " not in second.stdout and "(already current)" in second.stdout


def test_two_concurrent_migrations_serialise(tmp_path: Path, pg_empty_dsn: str) -> None:
    """Two mayu migrate at once on an empty database: both succeed, the schema is
    built once (the second waits on the advisory lock, then finds it current)."""
    env = {"INFERPLANE_DATABASE_URL": pg_empty_dsn}
    procs = [subprocess.Popen([sys.executable, "-m", "gateway", "migrate"], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert _heads(pg_empty_dsn) == list(code_heads())


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    """No database at the URL: exit 2 with one line naming database.dsn_ref."""
    done = run("gateway", "migrate", cwd=tmp_path,
               INFERPLANE_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("mayu: error: database.dsn_ref:")


def test_schema_problem_says_what_to_do() -> None:
    """At head: nothing; empty or behind: run mayu migrate; ahead: a newer version."""
    assert schema_problem(code_heads()) is None
    assert "mayu migrate" in (schema_problem(()) or "")
    behind = schema_problem(("0001",)) if code_heads() != ("0001",) else "mayu migrate"
    assert "mayu migrate" in (behind or "")
    assert "newer inferplane" in (schema_problem(("9999_future",)) or "")


def test_inferplaned_refuses_an_unmigrated_database(tmp_path: Path,
                                                    pg_empty_dsn: str) -> None:
    """inferplaned serve on an empty database: exit 2, one line naming mayu migrate."""
    config = tmp_path / "inferplaned.yaml"
    config.write_text(yaml.safe_dump({"database": {"dsn_ref": "env:IPT_CP_DSN"}}))
    done = run("controlplane.cli", "serve", "--config", str(config), "--port", "0",
               cwd=tmp_path, IPT_CP_DSN=pg_empty_dsn)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and "mayu migrate" in lines[0], done.stderr
    assert "UndefinedTable" not in done.stderr


async def test_app_components_refuse_an_unmigrated_database(pg_empty_dsn: str,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    """The app factory's shared components (every entry point, not only mayu serve)
    refuse an empty database with the one line naming mayu migrate."""
    from contextlib import AsyncExitStack

    from gateway.app import build_components
    from gateway.config import load_settings
    from gateway.errors import ConfigError

    monkeypatch.setenv("IPT_APP_DSN", pg_empty_dsn)
    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "demo": False,
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:IPT_APP_DSN", "pool_min_size": 1, "pool_max_size": 2}}))
    with pytest.raises(ConfigError, match="mayu migrate"):
        async with AsyncExitStack() as stack:
            await build_components(load_settings(config), stack)


def test_permits_command_refuses_a_database_behind(tmp_path: Path,
                                                   pg_empty_dsn: str) -> None:
    """``mayu permits list`` on a database behind the code (a pre-release one, whose
    functions are not the head's): exit 2, one line naming mayu migrate, no SQL error;
    once migrated it lists."""
    from tests.integration._pg_helpers import load_prerelease

    load_prerelease(pg_empty_dsn)
    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:IPT_PERMITS_DSN"}}))
    behind = run("gateway", "permits", "list", "--config", str(config), cwd=tmp_path,
                 IPT_PERMITS_DSN=pg_empty_dsn)
    assert behind.returncode == 2, behind.stderr
    lines = [line for line in behind.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and "mayu migrate" in lines[0], behind.stderr
    assert run("gateway", "migrate", "--config", str(config), cwd=tmp_path,
               IPT_PERMITS_DSN=pg_empty_dsn).returncode == 0
    current = run("gateway", "permits", "list", "--config", str(config), cwd=tmp_path,
                  IPT_PERMITS_DSN=pg_empty_dsn)
    assert current.returncode == 0, current.stderr


def test_a_0_1_0_database_is_refused_then_migrated_to_head(tmp_path: Path,
                                                           pg_empty_dsn: str) -> None:
    """A database at the 0.1.0 baseline: mayu serve refuses it in one line naming the
    revision and mayu migrate; mayu migrate applies every later revision up to head."""
    from tests.conftest import migrate

    migrate(pg_empty_dsn, "v010_baseline")
    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:IPT_RELEASE_DSN"}}))
    serve = run("gateway", "serve", "--config", str(config), "--port", "0", cwd=tmp_path,
                IPT_RELEASE_DSN=pg_empty_dsn)
    assert serve.returncode == 2, serve.stderr
    lines = [line for line in serve.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1, serve.stderr
    assert "at revision v010_baseline" in lines[0] and "mayu migrate" in lines[0]
    migrated = run("gateway", "migrate", "--config", str(config), cwd=tmp_path,
                   IPT_RELEASE_DSN=pg_empty_dsn)
    assert migrated.returncode == 0, migrated.stderr
    assert "v010_baseline -> v011_console_sessions" in migrated.stdout
    assert _heads(pg_empty_dsn) == list(code_heads())
