"""``mayu members`` / ``mayu users`` run as the real console script, in subprocesses
(only the ``--help`` texts are read in-process, from the same parser).

Each test works in its own temp directory (the local profile's store is
``.mayu/mayu.db`` there); one runs on a migrated Postgres through a shared-profile
config. What the commands print is compared with what the key store — the admin API's
service functions — answers, read in-process after they ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gateway.cli import main
from gateway.governance import CounterKey, LocalGovernanceStore, Permit, Refusal, utc_windows
from gateway.keys import KeyStore, MemberLimits, SqliteKeyStore, TeamLimits, hash_key
from tests.integration._pg_helpers import NOW
from tests.integration.test_inflight import Stores, admit

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MAYU = Path(sys.executable).with_name("mayu")
T = TypeVar("T")


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def mayu(cwd: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MAYU), *args], cwd=cwd, env=_env(extra_env),
                          capture_output=True, text=True, timeout=60)


def each(cwd: Path, *calls: tuple[str, ...], **extra_env: str) -> list[tuple[int, str, str]]:
    """Independent commands, run side by side, as (exit code, stdout, stderr)."""
    procs = [subprocess.Popen([str(MAYU), *args], cwd=cwd, env=_env(extra_env), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for args in calls]
    done = [p.communicate(timeout=60) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, done, strict=True)]


def all_ok(cwd: Path, *calls: tuple[str, ...], **extra_env: str) -> list[str]:
    answers = each(cwd, *calls, **extra_env)
    for args, (code, _, err) in zip(calls, answers, strict=True):
        assert code == 0, (args, err)
    return [out for _, out, _ in answers]


def ok(cwd: Path, *args: str, **extra_env: str) -> str:
    done = mayu(cwd, *args, **extra_env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def with_store(cwd: Path, call: Callable[[KeyStore], Awaitable[T]]) -> T:
    """Call the local profile's key store in-process: to read what the CLI wrote, or to
    set up what a test needs (a subprocess per step would only add seconds)."""
    async def _call() -> T:
        (cwd / ".mayu").mkdir(exist_ok=True)
        store = SqliteKeyStore(str(cwd / ".mayu" / "mayu.db"))
        await store.open()
        try:
            return await call(store)
        finally:
            await store.close()
    return asyncio.run(_call())


def team_with_keys(cwd: Path, *users: str) -> str:
    """Team ``ml`` ($50 a day) with a key for each of ``users``; the last key's secret."""
    async def _create(store: KeyStore) -> str:
        await store.create_team(name="ml", limits=TeamLimits(usd_micros_per_day=50_000_000))
        secret = ""
        for user in users:
            secret, _ = await store.create_key(team="ml", user=user)
        return secret
    return with_store(cwd, _create)


def test_members_set_list_remove_and_the_default(tmp_path: Path) -> None:
    """set, set-default, list, remove and remove-default write what the store then holds,
    and list shows each user's binding budget, its source and key count as the store has
    them."""
    team_with_keys(tmp_path, "ana", "ana", "bob")
    out = ok(tmp_path, "members", "set", "ml", "ana", "--usd-per-day", "1.50",
             "--tokens-per-day", "200000")
    assert out == ("set member ana's budget in team ml (revision 1): tokens_per_day=200000, "
                   "usd/day=$1.50\n")
    ok(tmp_path, "members", "set-default", "ml", "--usd-micros-per-month", "7000000")
    as_json, table = all_ok(tmp_path, ("members", "list", "ml", "--json"),
                            ("members", "list", "ml"))
    listed = json.loads(as_json)
    ana, bob, default = with_store(tmp_path, lambda s: asyncio.gather(
        s.get_member("ml", "ana"), s.get_member("ml", "bob"), s.get_member("ml", "*")))
    assert ana is not None and bob is None and default is not None
    assert ana.limits == MemberLimits(tokens_per_day=200_000, usd_micros_per_day=1_500_000)
    assert default.limits == MemberLimits(usd_micros_per_month=7_000_000)
    assert [(m["user"], m["source"], m["keys"], m["revision"], m["limits"])
            for m in listed["data"]] == [
        ("ana", "member", 2, 1, {"tokens_per_day": 200_000, "usd_micros_per_day": 1_500_000,
                                 "usd_micros_per_month": None}),
        ("bob", "default", 1, 0, {"tokens_per_day": None, "usd_micros_per_day": None,
                                  "usd_micros_per_month": 7_000_000})]
    assert listed["default"]["usd_micros_per_month"] == 7_000_000
    assert "default member budget (revision 1): usd/month=$7.00" in table
    assert ["ana", "member", "200000", "$1.50", "-", "2", "1"] in [
        line.split() for line in table.splitlines()]

    removed = ok(tmp_path, "members", "remove", "ml", "ana")
    assert "the team's default binds them now: usd/month=$7.00" in removed
    ok(tmp_path, "members", "remove-default", "ml")
    assert with_store(tmp_path, lambda s: s.list_members("ml")) == []


def test_users_set_show_and_list(tmp_path: Path) -> None:
    """users set writes the whole budget and keeps an email it was not given; show and
    list print what the store holds."""
    ok(tmp_path, "users", "set", "ana", "--email", "ana@example.com", "--display-name",
       "Ana B", "--tokens-per-day", "5000000")
    again = json.loads(ok(tmp_path, "users", "set", "ana", "--usd-per-month", "100",
                          "--json"))
    stored = with_store(tmp_path, lambda s: s.get_user("ana"))
    assert stored is not None and stored.revision == 2
    assert (stored.email, stored.display_name) == ("ana@example.com", "Ana B")
    assert stored.limits == MemberLimits(usd_micros_per_month=100_000_000)
    assert again["limits"] == {"tokens_per_day": None, "usd_micros_per_day": None,
                               "usd_micros_per_month": 100_000_000}
    shown, as_json = all_ok(tmp_path, ("users", "show", "ana"), ("users", "list", "--json"))
    assert shown.splitlines() == ["user ana (revision 2)", "email: ana@example.com",
                                  "display name: Ana B",
                                  "budget across teams: usd/month=$100.00"]
    [listed] = json.loads(as_json)
    assert (listed["name"], listed["email"], listed["limits"]["usd_micros_per_month"]) == (
        "ana", "ana@example.com", 100_000_000)


BAD = [
    (("members", "set", "ml", "ana", "--usd-micros-per-day", "-5"),
     "argument --usd-micros-per-day: must be an integer in 0..1125899906842624"),
    (("members", "set-default", "ml", "--usd-per-month", "2000000000"),
     "argument --usd-per-month: must be at most $1125899906"),
    (("users", "set", "ana", "--tokens-per-day", "lots"),
     "argument --tokens-per-day: not a whole number: 'lots'"),
    (("members", "set", "ml", "*", "--usd-per-day", "1"),
     "argument USER: '*' is the team's default member budget"),
    (("users", "set", "*", "--tokens-per-day", "1"), "argument USER: '*' names a team's"),
    (("members", "set", "nope", "ana", "--usd-per-day", "1"), "team 'nope' does not exist"),
]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """A negative, too large or non-number figure, a '*' user and an unknown team each
    exit 2 with one line on stderr naming the flag or the team, and write nothing."""
    team_with_keys(tmp_path)
    for (args, message), (code, out, err) in zip(BAD, each(tmp_path, *(a for a, _ in BAD)),
                                                 strict=True):
        assert code == 2, (args, err)
        assert message in err and len(err.splitlines()) == 1, (args, err)
        assert out == "", args
    assert with_store(tmp_path, lambda s: s.list_members("ml")) == []
    assert with_store(tmp_path, lambda s: s.list_users()) == []


def test_a_stale_revision_is_refused_with_the_current_one(tmp_path: Path) -> None:
    """--if-revision / --expected-revision behind the store's revision: exit 2 naming
    the current revision, and the budget is left as it was."""
    team_with_keys(tmp_path)
    budget = MemberLimits(usd_micros_per_day=1_000_000)
    with_store(tmp_path, lambda s: asyncio.gather(s.put_member("ml", "ana", limits=budget),
                                                  s.put_user("ana", limits=budget)))
    refusals = each(tmp_path,
                    ("members", "set", "ml", "ana", "--usd-per-day", "9", "--if-revision", "0"),
                    ("members", "remove", "ml", "ana", "--expected-revision", "4"),
                    ("users", "set", "ana", "--usd-per-day", "9", "--if-revision", "3"))
    expected = ["member 'ana' of team 'ml' is at revision 1, not 0",
                "member 'ana' of team 'ml' is at revision 1, not 4",
                "user 'ana' is at revision 1, not 3"]
    for (code, _, err), message in zip(refusals, expected, strict=True):
        assert code == 2 and err == f"mayu: error: {message}; re-read it and retry\n", err
    member, user = with_store(tmp_path, lambda s: asyncio.gather(
        s.get_member("ml", "ana"), s.get_user("ana")))
    assert member is not None and user is not None
    assert (member.revision, member.limits.usd_micros_per_day) == (1, 1_000_000)
    assert (user.revision, user.limits.usd_micros_per_day) == (1, 1_000_000)


def test_a_member_budget_set_by_the_cli_binds_an_admission(tmp_path: Path) -> None:
    """ana's member budget of 1,500 µUSD a day, set with the CLI: her first 1,000 µUSD
    admission passes, the second is refused naming her member counter."""
    secret = team_with_keys(tmp_path, "ana")
    ok(tmp_path, "members", "set", "ml", "ana", "--usd-micros-per-day", "1500")

    async def _admit_twice() -> tuple[Any, Any, Any]:
        db = str(tmp_path / ".mayu" / "mayu.db")
        keys, gov = SqliteKeyStore(db), LocalGovernanceStore(db)
        await keys.open()
        await gov.open()
        try:
            ana = await keys.resolve(hash_key(secret))
            assert ana is not None
            s = Stores("local", keys, gov)
            snap = await s.snapshot()
            return ana, await admit(s, ana, snap, "r1"), await admit(s, ana, snap, "r2")
        finally:
            await gov.close()
            await keys.close()
    ana, first, second = asyncio.run(_admit_twice())
    assert isinstance(first, Permit) and isinstance(second, Refusal)
    day, _ = utc_windows(NOW)
    member = CounterKey.member(ana.team.id, "ana").windowed("usd", "day", day).text
    assert (second.status, second.code, second.counter) == (402, "budget_exhausted", member)


SHARED = """key_store: {type: postgres}
governance_store: {type: postgres}
database: {dsn_ref: env:MEMBERS_CLI_TEST_DSN}
"""


def test_the_shared_profile_keeps_members_and_users_in_postgres(
        tmp_path: Path, pg_dsn: str) -> None:
    """With a shared-profile config the same commands work on the Postgres key store;
    the local data dir is never created."""
    cfg = tmp_path / "shared.yaml"
    cfg.write_text(SHARED)
    env = {"MEMBERS_CLI_TEST_DSN": pg_dsn}
    shared = ("--config", str(cfg))
    ok(tmp_path, "teams", "create", "pg", *shared, **env)
    all_ok(tmp_path, ("members", "set", "pg", "ana", "--usd-per-day", "2.5", *shared),
           ("members", "set-default", "pg", "--tokens-per-day", "1000", *shared),
           ("users", "set", "ana", "--email", "ana@example.com", "--usd-per-month", "40",
            *shared), **env)
    as_json, shown = all_ok(tmp_path, ("members", "list", "pg", "--json", *shared),
                            ("users", "show", "ana", "--json", *shared), **env)
    listed = json.loads(as_json)
    assert [(m["user"], m["source"], m["limits"]["usd_micros_per_day"])
            for m in listed["data"]] == [("ana", "member", 2_500_000)]
    assert listed["default"]["tokens_per_day"] == 1000
    user = json.loads(shown)
    assert (user["email"], user["limits"]["usd_micros_per_month"]) == ("ana@example.com",
                                                                        40_000_000)
    assert not (tmp_path / ".mayu").exists()


def test_every_members_and_users_command_has_help(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--help works on every group and command; the set commands say what each figure
    means and that a limit left out is no cap. (In-process: it is the parser's text.)"""
    commands = [("members",), ("members", "list"), ("members", "set"), ("members", "remove"),
                ("members", "set-default"), ("members", "remove-default"), ("users",),
                ("users", "list"), ("users", "show"), ("users", "set")]
    for args in commands:
        with pytest.raises(SystemExit) as done:
            main([*args, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "usage: mayu " + " ".join(args) in out
        if args[-1] in ("set", "set-default"):
            flat = " ".join(out.split())
            assert "A limit left out is no cap" in flat and "per UTC day" in flat
            assert "--usd-micros-per-month" in flat and "--if-revision" in flat
