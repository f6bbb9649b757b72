"""``mayu teams …`` and ``mayu keys …``: manage teams and virtual keys.

Works on the configured key store (``--config FILE``; without one, the local profile's
SQLite file under ``.mayu``). Money flags take dollars as an exact decimal string
(``--usd-per-day 1.50``, parsed with :class:`decimal.Decimal`) or integer µUSD
(``--usd-micros-per-day 1500000``); a float never touches money. Every figure is
checked against the ceiling the store applies (``gateway.ceilings``) before the store is
opened: a bad one is one line and exit 2. A new key's plaintext is printed once and
never stored.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import msgspec

from gateway.ceilings import MAX_AMOUNT, MAX_BUCKET_CAPACITY
from gateway.cli import _args
from gateway.cli._args import MICROS
from gateway.cli._commands import add_command, command_group
from gateway.config import load_settings
from gateway.errors import BadRequest, NotFound
from gateway.guardrails import check_profiles
from gateway.keys import (
    MAX_GRACE_S,
    KeyLimits,
    KeyRecord,
    KeyStore,
    Team,
    TeamLimits,
    open_key_store,
)

T = TypeVar("T")
MAX_COUNT = 2**31 - 1
"""The largest revision, minute count or listing limit a flag takes."""
MAX_EXPIRY_DAYS = 36_500
"""``--expires-in-days``: a century (a key's expiry must stay a date)."""


# -- argument types (gateway.cli._args: one line and exit 2 for bad input) -----------

def _count(text: str) -> int:
    """A token or µUSD figure: a whole number within the planner's ``MAX_AMOUNT``."""
    return _args.whole(text, high=MAX_AMOUNT)


def _rate(text: str) -> int:
    """An rpm/tpm bucket capacity: 1 to ``MAX_BUCKET_CAPACITY`` (0 would mean no cap)."""
    return _args.whole(text, low=1, high=MAX_BUCKET_CAPACITY)


def _positive(text: str) -> int:
    """A revision, a count of minutes, a listing limit: 1 to ``MAX_COUNT``."""
    return _args.whole(text, low=1, high=MAX_COUNT)


def _profile(text: str) -> str:
    """A guardrail profile's name: a lowercase label (docs/guardrails.md)."""
    if not re.fullmatch(r"[a-z][a-z0-9_-]{0,39}", text):
        raise argparse.ArgumentTypeError(
            f"{_args.shown(text)} is not a profile name (a lowercase label, at most 40)")
    return text


def _profiles(text: str) -> tuple[str, ...]:
    """``teams set --guardrails``: profile names separated by commas ('' for none)."""
    return tuple(_profile(n.strip()) for n in text.split(",") if n.strip())


def _days(text: str) -> int:
    return _args.whole(text, low=1, high=MAX_EXPIRY_DAYS, unit=" days")


def parse_usd(text: str) -> int:
    """Dollars as an exact decimal string (``1.50``) to integer µUSD."""
    return _args.usd(text)


def format_usd(micros: int | None) -> str:
    if micros is None:
        return "-"
    whole, frac = divmod(micros, MICROS)
    return f"${whole}.{f'{frac:06d}'.rstrip('0').ljust(2, '0')}"


# -- shared plumbing ------------------------------------------------------------------

def _run(args: argparse.Namespace, action: Callable[[KeyStore], Awaitable[T]]) -> T:
    async def _main() -> T:
        store = await open_key_store(load_settings(args.config))
        try:
            return await action(store)
        finally:
            await store.close()
    return asyncio.run(_main())


def _money(args: argparse.Namespace, period: str) -> int | None:
    value: int | None = getattr(args, f"usd_per_{period}")
    micros: int | None = getattr(args, f"usd_micros_per_{period}")
    return value if value is not None else micros


def _print_json(value: Any) -> None:
    print(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True))


def _listing(args: argparse.Namespace, items: Sequence[Any], *, empty: str,
             header: tuple[str, ...], rows: Callable[[], list[tuple[str, ...]]]) -> int:
    """A list command's answer: ``items`` as JSON with ``--json``, else ``empty`` for
    none, else the table of ``header`` and ``rows()``; exit 0."""
    if args.json:
        _print_json(items)
    elif not items:
        print(empty)
    else:
        _table(header, rows())
    return 0


def _answer(args: argparse.Namespace, value: Any, line: str) -> int:
    """A command's answer: ``value`` as JSON with ``--json``, else ``line``; exit 0."""
    if args.json:
        _print_json(value)
    else:
        print(line)
    return 0


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _limits_text(limits: TeamLimits | KeyLimits) -> str:
    parts = [f"{name}={value}" for name in ("rpm", "tpm", "tokens_per_day")
             if (value := getattr(limits, name, None)) is not None]
    for period in ("day", "month"):
        micros = getattr(limits, f"usd_micros_per_{period}")
        if micros is not None:
            parts.append(f"usd/{period}={format_usd(micros)}")
    floor = getattr(limits, "budget_fit_floor", None)
    if floor is not None:
        parts.append(f"budget fit down to max_tokens {floor}")
    return ", ".join(parts) or "no limits"


# -- teams ----------------------------------------------------------------------------

def _fit_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget-fit-floor", type=_count, metavar="TOKENS",
        help="budget fit (opt-in): when a request's worst case does not fit the team's "
             "remaining money or token quota, lower its max_tokens to the largest value "
             "that fits, if at least TOKENS (e.g. 1024); without it such requests are "
             "refused")


def _team_limit_args(parser: argparse.ArgumentParser) -> None:
    """A team's limits, as ``teams create`` and ``teams set`` take them."""
    _rate_args(parser, "team")
    parser.add_argument("--tokens-per-day", type=_count, help="team tokens per UTC day")
    _money_args(parser, "team")
    _fit_arg(parser)


def _teams_create(args: argparse.Namespace) -> int:
    limits = TeamLimits(rpm=args.rpm, tpm=args.tpm, tokens_per_day=args.tokens_per_day,
                        usd_micros_per_day=_money(args, "day"),
                        usd_micros_per_month=_money(args, "month"),
                        budget_fit_floor=args.budget_fit_floor)
    team = _run(args, lambda s: s.create_team(name=args.name, limits=limits,
                                              guardrails=tuple(args.guardrails)))
    return _answer(args, team, f"created team {team.name} (id {team.id}, revision "
                               f"{team.revision}): {_limits_text(team.limits)}")


def _teams_list(args: argparse.Namespace) -> int:
    teams: list[Team] = _run(args, lambda s: s.list_teams())
    return _listing(
        args, teams, empty="no teams (create one with: mayu teams create NAME)",
        header=("NAME", "ID", "REV", "RPM", "TPM", "TOKENS/DAY", "USD/DAY", "USD/MONTH"),
        rows=lambda: [(t.name, t.id, str(t.revision), _opt(t.limits.rpm),
                       _opt(t.limits.tpm), _opt(t.limits.tokens_per_day),
                       format_usd(t.limits.usd_micros_per_day),
                       format_usd(t.limits.usd_micros_per_month)) for t in teams])


_UNSET = {"rpm": "rpm", "tpm": "tpm", "tokens-per-day": "tokens_per_day",
          "usd-per-day": "usd_micros_per_day", "usd-per-month": "usd_micros_per_month",
          "budget-fit": "budget_fit_floor"}


def _unset_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in _UNSET:
            raise argparse.ArgumentTypeError(f"unknown limit {_args.shown(name)} (one of: "
                                             f"{', '.join(_UNSET)})")
    return names


def _teams_set(args: argparse.Namespace) -> int:
    given = {"rpm": args.rpm, "tpm": args.tpm, "tokens_per_day": args.tokens_per_day,
             "usd_micros_per_day": _money(args, "day"),
             "usd_micros_per_month": _money(args, "month"),
             "budget_fit_floor": args.budget_fit_floor}
    changes = {k: v for k, v in given.items() if v is not None}
    for flag in args.unset or ():
        if _UNSET[flag] in changes:
            raise BadRequest(f"--unset {flag}: also given a new value; choose one")
        changes[_UNSET[flag]] = None
    if not changes and args.guardrails is None:
        raise BadRequest("teams set: give at least one limit to change, --unset or "
                         "--guardrails")
    if args.guardrails is not None:  # only profiles this config defines (a 400 else)
        check_profiles(load_settings(args.config).guardrails, args.guardrails)

    async def _update(store: KeyStore) -> Team:
        team = await store.get_team(args.name)
        if team is None:
            raise NotFound(f"team {args.name!r} does not exist")
        limits = msgspec.structs.replace(team.limits, **changes) if changes else None
        expected = team.revision if args.expected_revision is None else args.expected_revision
        # The store compares the revision in its write transaction (as the admin API's
        # PATCH /admin/v1/teams/{team} does).
        updated: Team = await store.update_team(
            team.id, limits=limits, guardrails=args.guardrails, expected_revision=expected)
        return updated
    team = _run(args, _update)
    return _answer(args, team, f"updated team {team.name} (revision {team.revision}): "
                               f"{_limits_text(team.limits)}; guardrails: "
                               f"{', '.join(team.guardrails) or 'none'}")


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


# -- keys -----------------------------------------------------------------------------

def _keys_create(args: argparse.Namespace) -> int:
    models = None
    if args.models is not None:
        models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    expires = None
    if args.expires_in_days is not None:
        expires = datetime.now(UTC) + timedelta(days=args.expires_in_days)
    limits = KeyLimits(rpm=args.rpm, tpm=args.tpm, usd_micros_per_day=_money(args, "day"),
                       usd_micros_per_month=_money(args, "month"))
    plaintext, record = _run(args, lambda s: s.create_key(
        team=args.team, name=args.name, user=args.user, allowed_models=models,
        limits=limits, expires_at=expires))
    if args.json:
        _print_json({"key": plaintext, "record": record})
        return 0
    print(f"created key {record.id} (team {args.team}, prefix {record.display_prefix}"
          f"{', user ' + record.user if record.user else ''})")
    print(f"limits: {_limits_text(record.limits)}; models: "
          f"{', '.join(record.allowed_models) if record.allowed_models is not None else 'all'}"
          f"{'; expires ' + record.expires_at.isoformat() if record.expires_at else ''}")
    print()
    print(f"    {plaintext}")
    print()
    print("Store this key now: it is shown only once and cannot be recovered.",
          file=sys.stderr)
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    async def _load(store: KeyStore) -> tuple[list[KeyRecord], dict[str, str]]:
        keys = await store.list_keys(team=args.team, include_revoked=args.all)
        return keys, {t.id: t.name for t in await store.list_teams()}
    keys, team_names = _run(args, _load)
    now = datetime.now(UTC)
    return _listing(
        args, keys, empty="no keys" + ("" if args.all else
                                       " (revoked keys are shown with --all)"),
        header=("ID", "PREFIX", "TEAM", "NAME", "USER", "MODELS", "STATUS", "REV"),
        rows=lambda: [(k.id, k.display_prefix, team_names.get(k.team_id, k.team_id),
                       k.name or "-", k.user or "-",
                       ",".join(k.allowed_models) if k.allowed_models is not None
                       else "all", k.status(now), str(k.revision)) for k in keys])


def _keys_revoke(args: argparse.Namespace) -> int:
    record = _run(args, lambda s: s.revoke_key(args.id,
                                               expected_revision=args.expected_revision))
    return _answer(args, record, f"revoked key {record.id} ({record.display_prefix}) at "
                   f"{record.revoked_at.isoformat() if record.revoked_at else '?'}; "
                   f"revision {record.revision}")


def _grace(text: str) -> int:
    return _args.whole(text, low=0, high=MAX_GRACE_S, unit=" seconds")


def _keys_rotate(args: argparse.Namespace) -> int:
    done = _run(args, lambda s: s.rotate_key(
        args.id, grace_s=args.grace_seconds, idempotency_key=args.idempotency_key,
        expected_revision=args.expected_revision))
    if args.json:
        _print_json({"key": done.secret, "record": done.key,
                     "previous_valid_until": done.previous_valid_until,
                     "replayed": done.replayed})
        return 0
    print(f"rotated key {done.key.id} (revision {done.key.revision}, prefix "
          f"{done.key.display_prefix}); the previous secret works until "
          f"{done.previous_valid_until.isoformat()}"
          + (" (a retry: this is the first rotation's secret)" if done.replayed else ""))
    print()
    print(f"    {done.secret}")
    print()
    print("Store this key now: it is shown only once and cannot be recovered.",
          file=sys.stderr)
    return 0


# -- parser ---------------------------------------------------------------------------

def _common(parser: argparse.ArgumentParser, *, json_help: str) -> None:
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="gateway config file (default: none, the local profile with "
                             "its data in .mayu)")
    parser.add_argument("--json", action="store_true", help=json_help)


def _money_args(parser: argparse.ArgumentParser, what: str) -> None:
    for period in ("day", "month"):
        group = parser.add_mutually_exclusive_group()
        group.add_argument(f"--usd-per-{period}", type=parse_usd, metavar="DOLLARS",
                           help=f"{what} spending limit per UTC {period}, in dollars as an "
                                "exact decimal (e.g. 1.50)")
        group.add_argument(f"--usd-micros-per-{period}", type=_count, metavar="MICROS",
                           help="the same limit in integer µUSD (1500000 = $1.50)")


def _rate_args(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--rpm", type=_rate, help=f"{what} requests per minute")
    parser.add_argument("--tpm", type=_rate, help=f"{what} tokens per minute")


def _add(sub: Any, name: str, func: Callable[[argparse.Namespace], int], summary: str,
         json_help: str) -> argparse.ArgumentParser:
    parser = add_command(sub, name, func, summary=summary)
    _common(parser, json_help=json_help)
    return parser


def _register_teams(subparsers: Any) -> None:
    sub = command_group(
        subparsers, "teams", summary="create and list teams",
        description="Create and list teams (every key belongs to "
                    "one team; team limits bind all its keys).")
    create = _add(sub, "create", _teams_create, "create a team with its limits "
                  "(omitted limits are uncapped)", "print the new team as JSON")
    create.add_argument("name", metavar="NAME", type=_args.text, help="unique team name")
    _team_limit_args(create)
    create.add_argument("--guardrails", metavar="PROFILE", action="append", default=[],
                        type=_profile, help="a guardrail profile the team opts into "
                        "(repeatable; docs/guardrails.md)")
    _add(sub, "list", _teams_list, "list teams and their limits", "print JSON")
    update = _add(sub, "set", _teams_set, "change some of a team's limits or its guardrail "
                  "profiles (the rest is kept); the edit bumps the team's revision, so every "
                  "replica's next admission uses it", "print the team as JSON")
    update.add_argument("name", metavar="NAME", type=_args.text, help="team name or id")
    _team_limit_args(update)
    update.add_argument("--unset", type=_unset_list, metavar="LIMIT[,LIMIT]",
                        help="remove these caps: " + ", ".join(_UNSET))
    update.add_argument("--guardrails", type=_profiles, metavar="PROFILE[,PROFILE]",
                        help="replace the team's guardrail profiles with these (each one of "
                             "the config's guardrails.profiles; '' for none: the org-wide "
                             "guardrails block alone; docs/guardrails.md)")
    update.add_argument("--expected-revision", type=_positive, metavar="N",
                        help="refuse unless the team is still at this revision "
                             "(default: the revision just read)")


def _register_keys(subparsers: Any) -> None:
    sub = command_group(
        subparsers, "keys", summary="create, list, rotate and revoke virtual keys",
        description="Create, list, rotate and revoke virtual keys. "
                    "Keys are "
                    "stored as SHA-256 hashes; the plaintext is "
                    "shown once, at creation.")
    create = _add(sub, "create", _keys_create, "create a key and print it once",
                  "print {key, record} as JSON (the key is still shown only this once)")
    create.add_argument("--team", required=True, type=_args.text, help="team name or id")
    create.add_argument("--name", default="", type=_args.text, help="a label for the key")
    create.add_argument("--user", default=None, type=_args.text,
                        help="the user the key belongs to (a user is named within its "
                             "team: policy rules charge each team's user apart)")
    create.add_argument("--models", metavar="A,B", default=None, type=_args.text,
                        help="comma-separated models the key may use (default: all)")
    _rate_args(create, "key")
    _money_args(create, "key")
    create.add_argument("--expires-in-days", type=_days, metavar="DAYS",
                        help="the key stops working after this many days")
    listing = _add(sub, "list", _keys_list, "list keys (never their plaintext)", "print JSON")
    listing.add_argument("--team", default=None, type=_args.text,
                         help="only this team's keys (name or id)")
    listing.add_argument("--all", action="store_true", help="include revoked keys")
    revoke = _add(sub, "revoke", _keys_revoke, "revoke a key (it stays listed as revoked)",
                  "print the revoked record as JSON")
    revoke.add_argument("id", metavar="ID", type=_args.text,
                        help="key id (see mayu keys list)")
    revoke.add_argument("--expected-revision", type=_positive, metavar="N",
                        help="refuse unless the key is still at this revision")
    rotate = _add(sub, "rotate", _keys_rotate,
                  "give a key a new secret (same id, limits and spend) and print it once",
                  "print {key, record, previous_valid_until, replayed} as JSON")
    rotate.add_argument("id", metavar="ID", type=_args.text,
                        help="key id (see mayu keys list)")
    rotate.add_argument("--grace-seconds", type=_grace, default=86400, metavar="S",
                        help="how long the previous secret keeps working (default 86400: "
                             f"a day; 0: not at all; at most {MAX_GRACE_S})")
    rotate.add_argument("--idempotency-key", type=_args.text, default=None, metavar="TEXT",
                        help="run again with the same value to get the same new secret "
                             "(a retry after a lost answer) instead of a second rotation")
    rotate.add_argument("--expected-revision", type=_positive, metavar="N",
                        help="refuse unless the key is still at this revision")
    _register_import(sub)


def _register_import(sub: Any) -> None:
    """``mayu keys import`` lives with the Postgres import code (gateway/cli/_import.py,
    optional): its ``register`` is handed the ``keys`` sub-commands and adds ``import``."""
    try:
        module = importlib.import_module("gateway.cli._import")
    except ModuleNotFoundError as exc:
        if exc.name != "gateway.cli._import":
            raise
        return
    module.register(sub)


def register(subparsers: Any) -> None:
    _register_teams(subparsers)
    _register_keys(subparsers)
