"""``mayu teams`` / ``mayu keys`` / ``mayu config check`` run as real subprocesses.

Each test works in its own temp directory, so the default data dir (``.mayu``) and any
config file are private to it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from gateway.keys import SqliteKeyStore, hash_key

ROOT = Path(__file__).resolve().parents[2]


def mayu(cwd: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def ok(cwd: Path, *args: str, **extra_env: str) -> str:
    done = mayu(cwd, *args, **extra_env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def resolve(db: Path, plaintext: str):
    async def _resolve():
        store = SqliteKeyStore(str(db))
        await store.open()
        try:
            return await store.resolve(hash_key(plaintext))
        finally:
            await store.close()
    return asyncio.run(_resolve())


def test_team_and_key_lifecycle_in_the_default_data_dir(tmp_path):
    """teams create/list, keys create/list/revoke work end to end on .mayu/mayu.db, and
    the printed key authenticates until it is revoked."""
    out = ok(tmp_path, "teams", "create", "ml", "--rpm", "10", "--usd-per-day", "1.50",
             "--usd-micros-per-month", "30000000")
    assert "created team ml" in out and "usd/day=$1.50" in out
    teams = json.loads(ok(tmp_path, "teams", "list", "--json"))
    assert [(t["name"], t["limits"]["usd_micros_per_day"],
             t["limits"]["usd_micros_per_month"], t["limits"]["rpm"]) for t in teams] == [
        ("ml", 1_500_000, 30_000_000, 10)]

    created = json.loads(ok(tmp_path, "keys", "create", "--team", "ml", "--name", "ci",
                            "--user", "bob", "--models", "a,b", "--usd-per-day", "0.25",
                            "--json"))
    plaintext, record = created["key"], created["record"]
    assert record["limits"]["usd_micros_per_day"] == 250_000
    db = tmp_path / ".mayu" / "mayu.db"
    principal = resolve(db, plaintext)
    assert principal is not None and principal.user == "bob"
    assert principal.allowed_models == ("a", "b")

    listing = ok(tmp_path, "keys", "list")
    assert record["id"] in listing and "active" in listing and plaintext not in listing
    revoked = ok(tmp_path, "keys", "revoke", record["id"])
    assert "revoked key" in revoked
    assert resolve(db, plaintext) is None
    assert record["id"] not in ok(tmp_path, "keys", "list")
    assert "revoked" in ok(tmp_path, "keys", "list", "--all")


def test_teams_set_changes_only_the_given_limits_and_bumps_the_revision(tmp_path):
    """teams set keeps unmentioned limits, removes --unset ones, bumps the revision, and
    refuses a stale --expected-revision."""
    ok(tmp_path, "teams", "create", "ml", "--rpm", "10", "--usd-per-day", "2")
    team = json.loads(ok(tmp_path, "teams", "set", "ml", "--tpm", "500", "--unset",
                         "usd-per-day", "--json"))
    assert team["revision"] == 2
    assert (team["limits"]["rpm"], team["limits"]["tpm"],
            team["limits"]["usd_micros_per_day"]) == (10, 500, None)
    stale = mayu(tmp_path, "teams", "set", "ml", "--rpm", "1", "--expected-revision", "1")
    assert stale.returncode == 2 and "revision 2, not 1" in stale.stderr
    assert json.loads(ok(tmp_path, "teams", "list", "--json"))[0]["limits"]["rpm"] == 10


def test_key_create_prints_the_plaintext_once_clearly(tmp_path):
    """Without --json the key is printed on its own line with a shown-once warning."""
    ok(tmp_path, "teams", "create", "t")
    done = mayu(tmp_path, "keys", "create", "--team", "t")
    assert done.returncode == 0
    keys = [line.strip() for line in done.stdout.splitlines()
            if line.strip().startswith("sk-inf-") and " " not in line.strip()]
    assert len(keys) == 1
    assert "shown only once" in done.stderr
    assert resolve(tmp_path / ".mayu" / "mayu.db", keys[0]) is not None


def test_money_flags_are_exact_and_refuse_sub_micro_amounts(tmp_path):
    """Dollar flags parse exactly (0.000001 = 1 µUSD) and refuse finer amounts with exit 2."""
    ok(tmp_path, "teams", "create", "tiny", "--usd-per-day", "0.000001")
    [team] = json.loads(ok(tmp_path, "teams", "list", "--json"))
    assert team["limits"]["usd_micros_per_day"] == 1
    bad = mayu(tmp_path, "teams", "create", "x", "--usd-per-day", "0.0000001")
    assert bad.returncode == 2 and "--usd-per-day" in bad.stderr
    both = mayu(tmp_path, "teams", "create", "x", "--usd-per-day", "1",
                "--usd-micros-per-day", "1")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_errors_exit_2_with_a_clear_message(tmp_path):
    """Unknown team, unknown key, stale revision and a duplicate team exit 2 and say why."""
    ok(tmp_path, "teams", "create", "t")
    cases = [
        (("keys", "create", "--team", "nope"), "team 'nope' does not exist"),
        (("keys", "revoke", "key_missing"), "key 'key_missing' does not exist"),
        (("teams", "create", "t"), "already exists"),
    ]
    record = json.loads(ok(tmp_path, "keys", "create", "--team", "t", "--json"))["record"]
    cases.append((("keys", "revoke", record["id"], "--expected-revision", "5"),
                  "revision 1, not 5"))
    for args, message in cases:
        done = mayu(tmp_path, *args)
        assert done.returncode == 2, args
        assert message in done.stderr, (args, done.stderr)


def test_config_file_selects_the_store_path(tmp_path):
    """--config with key_store.path puts the keys in that file, not the default dir."""
    cfg = tmp_path / "mayu.yaml"
    cfg.write_text(f"key_store:\n  type: sqlite\n  path: {tmp_path / 'elsewhere.db'}\n")
    ok(tmp_path, "teams", "create", "t", "--config", str(cfg))
    assert (tmp_path / "elsewhere.db").exists()
    assert not (tmp_path / ".mayu").exists()
    assert "t" in json.loads(ok(tmp_path, "teams", "list", "--config", str(cfg),
                                "--json"))[0]["name"]


def test_every_command_has_help(tmp_path):
    """--help works on every group and command and describes each option."""
    for args in (("teams",), ("teams", "create"), ("teams", "list"), ("teams", "set"),
                 ("keys",),
                 ("keys", "create"), ("keys", "list"), ("keys", "revoke"), ("keys", "rotate"),
                 ("config",), ("config", "check")):
        out = ok(tmp_path, *args, "--help")
        assert "usage: mayu " + " ".join(args) in out
    assert "--expires-in-days" in ok(tmp_path, "keys", "create", "--help")


def test_config_check_summarises_the_default_profile(tmp_path):
    """config check without a file reports the local profile and the mock models."""
    out = ok(tmp_path, "config", "check")
    assert "profile: local" in out
    assert "mock-gpt" in out and "mock-claude" in out


def test_config_check_reports_the_bad_key_path(tmp_path):
    """A bad config exits 2 and names the offending key path."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("providers:\n  - name: up\n    kind: openai\n"
                   "models:\n  - name: m\n    deployments: [{provider: nope}]\n")
    done = mayu(tmp_path, "config", "check", "--config", str(cfg))
    assert done.returncode == 2
    assert "providers[0].base_url" in done.stderr
    cfg.write_text("server:\n  port: high\n")
    done = mayu(tmp_path, "config", "check", "--config", str(cfg))
    assert done.returncode == 2 and "server.port" in done.stderr


SHARED = """key_store: {type: postgres}
governance_store: {type: postgres}
database: {dsn_ref: env:B_CLI_TEST_DSN}
"""


def test_shared_config_manages_keys_in_postgres(tmp_path, pg_dsn):
    """With a shared-profile config the same commands work on the Postgres key store
    (a real migrated database), and the local data dir is never created."""
    cfg = tmp_path / "shared.yaml"
    cfg.write_text(SHARED)
    env = {"B_CLI_TEST_DSN": pg_dsn}
    ok(tmp_path, "teams", "create", "pg", "--tpm", "500", "--usd-per-month", "12.5",
       "--config", str(cfg), **env)
    [team] = json.loads(ok(tmp_path, "teams", "list", "--json", "--config", str(cfg), **env))
    assert (team["name"], team["limits"]["usd_micros_per_month"]) == ("pg", 12_500_000)
    created = json.loads(ok(tmp_path, "keys", "create", "--team", "pg", "--json",
                            "--config", str(cfg), **env))
    key_id = created["record"]["id"]
    ok(tmp_path, "keys", "revoke", key_id, "--config", str(cfg), **env)
    listed = json.loads(ok(tmp_path, "keys", "list", "--all", "--json", "--config", str(cfg),
                           **env))
    assert [(k["id"], k["revoked_at"] is not None) for k in listed] == [(key_id, True)]
    assert not (tmp_path / ".mayu").exists()


def test_shared_config_without_its_secret_exits_2(tmp_path):
    """A shared config whose DSN reference is unset fails with the key path, exit 2."""
    cfg = tmp_path / "shared.yaml"
    cfg.write_text(SHARED)
    env = {k: v for k, v in os.environ.items() if k != "B_CLI_TEST_DSN"}
    done = subprocess.run([sys.executable, "-m", "gateway", "teams", "list", "--config",
                           str(cfg)], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "database.dsn_ref" in done.stderr and "B_CLI_TEST_DSN" in done.stderr
