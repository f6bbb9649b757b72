"""``mayu members …`` and ``mayu users …``: member budgets (a user's within a team) and
users (a user's budget across teams).

The same service functions as the admin API's routes (:mod:`gateway.admin._members`): the
key store's ``put_member``, ``delete_member``, ``put_user``, ``get_user``, ``list_users``
and ``team_members`` for the listing, so the CLI shows the figures
``GET /admin/v1/teams/{team}/members`` answers. Store, flags and
errors as ``mayu teams`` and ``mayu keys`` (:mod:`gateway.cli._keys`, whose argument
types and output helpers these are): ``--config FILE`` or the local profile's SQLite
under ``.mayu``; money as exact dollars or integer µUSD, checked against the store's
ceilings before it is opened; bad input one line and exit 2. A ``set`` writes the whole
budget, as the API's PUT does: a limit left out is no cap. Like the keys CLI, these
commands write no audit line (the admin API's audit names the token that called it).
"""

from __future__ import annotations

import argparse
from typing import Any, get_args

import msgspec

from gateway.cli import _args
from gateway.cli._commands import command_group
from gateway.cli._keys import (
    MAX_COUNT,
    _add,
    _answer,
    _count,
    _limits_text,
    _listing,
    _money,
    _money_args,
    _opt,
    _print_json,
    _run,
    _table,
    format_usd,
)
from gateway.errors import NotFound
from gateway.keys import (
    DEFAULT_MEMBER,
    KeyStore,
    Label,
    Member,
    MemberLimits,
    TeamLimits,
    TeamMembers,
    User,
)

_FIGURES = (
    "The budget binds {whom}: --tokens-per-day counts the tokens (prompt and completion) "
    "of their requests per UTC day; --usd-per-day and --usd-per-month what those requests "
    "may cost per UTC day and calendar month (or --usd-micros-per-day/-month, in µUSD). A "
    "limit left out is no cap on that dimension: this writes the whole budget, keeping "
    "none of the old one.")


# -- argument types (gateway.cli._args: one line and exit 2 for bad input) -----------

def _member(text: str) -> str:
    """A user named within a team; ``*`` is the team's default, with commands of its own."""
    name = _args.text(text)
    if name == DEFAULT_MEMBER:
        raise argparse.ArgumentTypeError(
            "'*' is the team's default member budget, not a user: use mayu members "
            "set-default TEAM or remove-default TEAM")
    return name


def _user(text: str) -> str:
    name = _args.text(text)
    if name == DEFAULT_MEMBER:
        raise argparse.ArgumentTypeError("'*' names a team's default member budget and "
                                         "cannot be a user")
    return name


def _label(text: str) -> str:
    """An email or display name, under the rule the admin API's ``PUT /users/{user}``
    body applies (:data:`gateway.keys.Label`)."""
    value = _args.text(text)
    _, meta = get_args(Label)
    try:
        return msgspec.convert(value, Label)
    except msgspec.ValidationError:
        if len(value) > meta.max_length:
            raise argparse.ArgumentTypeError(
                f"must be at most {meta.max_length} characters") from None
        raise argparse.ArgumentTypeError("must not hold control characters") from None


def _revision(text: str) -> int:
    """A revision to compare with: 0 means "only if it does not exist yet"."""
    return _args.whole(text, high=MAX_COUNT)


# -- shared plumbing ------------------------------------------------------------------

def _limits(args: argparse.Namespace) -> MemberLimits:
    return MemberLimits(tokens_per_day=args.tokens_per_day,
                        usd_micros_per_day=_money(args, "day"),
                        usd_micros_per_month=_money(args, "month"))


def _budget_text(limits: MemberLimits) -> str:
    # A member budget's figures are three of a team's: worded as `mayu teams` words them.
    return _limits_text(TeamLimits(**msgspec.structs.asdict(limits)))


def _figures(limits: MemberLimits) -> tuple[str, str, str]:
    return (_opt(limits.tokens_per_day), format_usd(limits.usd_micros_per_day),
            format_usd(limits.usd_micros_per_month))


# -- members --------------------------------------------------------------------------

def _members_list(args: argparse.Namespace) -> int:
    found: TeamMembers = _run(args, lambda s: s.team_members(args.team))
    views, default = found.members, found.default
    if args.json:  # the admin API's page: GET /admin/v1/teams/{team}/members
        _print_json({"object": "list", "data": views,
                     "default": None if default is None else default.limits,
                     "next_cursor": None})
        return 0
    if default is None:
        print(f"team {args.team}: no default member budget (a user without a budget of "
              "their own has no member cap)")
    else:
        print(f"team {args.team}: default member budget (revision {default.revision}): "
              f"{_budget_text(default.limits)}")
    if not views:
        print("no members (mayu members set TEAM USER, or a key created with --user, "
              "adds one)")
        return 0
    print()
    _table(("USER", "SOURCE", "TOKENS/DAY", "USD/DAY", "USD/MONTH", "KEYS", "REV"),
           [(v.user, v.source, *_figures(v.limits), str(v.keys), str(v.revision))
            for v in views])
    return 0


def _members_set(args: argparse.Namespace) -> int:
    limits = _limits(args)
    member: Member = _run(args, lambda s: s.put_member(
        args.team, args.user, limits=limits, expected_revision=args.expected_revision))
    return _answer(args, member, f"set member {member.user}'s budget in team {args.team} "
                   f"(revision {member.revision}): {_budget_text(member.limits)}")


def _members_remove(args: argparse.Namespace) -> int:
    async def _remove(store: KeyStore) -> tuple[Member, Member | None]:
        removed = await store.delete_member(args.team, args.user,
                                            expected_revision=args.expected_revision)
        return removed, await store.get_member(args.team, DEFAULT_MEMBER)
    member, default = _run(args, _remove)
    now = ("no member budget binds them now" if default is None else
           f"the team's default binds them now: {_budget_text(default.limits)}")
    return _answer(args, member, f"removed member {member.user}'s budget in team "
                   f"{args.team} (it was revision {member.revision}); {now}")


def _default_set(args: argparse.Namespace) -> int:
    limits = _limits(args)
    member: Member = _run(args, lambda s: s.put_member(
        args.team, DEFAULT_MEMBER, limits=limits, expected_revision=args.expected_revision))
    return _answer(args, member, f"set team {args.team}'s default member budget (revision "
                   f"{member.revision}): {_budget_text(member.limits)}")


def _default_remove(args: argparse.Namespace) -> int:
    member: Member = _run(args, lambda s: s.delete_member(
        args.team, DEFAULT_MEMBER, expected_revision=args.expected_revision))
    return _answer(args, member, f"removed team {args.team}'s default member budget (it "
                   f"was revision {member.revision}); users without a budget of their own "
                   "have no member cap")


# -- users ----------------------------------------------------------------------------

def _users_list(args: argparse.Namespace) -> int:
    users: list[User] = _run(args, lambda s: s.list_users())
    return _listing(
        args, users, empty="no users (add one with: mayu users set USER)",
        header=("NAME", "EMAIL", "DISPLAY NAME", "TOKENS/DAY", "USD/DAY", "USD/MONTH", "REV"),
        rows=lambda: [(u.name, u.email or "-", u.display_name or "-", *_figures(u.limits),
                       str(u.revision)) for u in users])


def _users_show(args: argparse.Namespace) -> int:
    user: User | None = _run(args, lambda s: s.get_user(args.user))
    if user is None:
        raise NotFound(f"user {args.user!r} does not exist")
    return _answer(args, user, _described(user))


def _users_set(args: argparse.Namespace) -> int:
    limits = _limits(args)

    async def _put(store: KeyStore) -> User:
        current = await store.get_user(args.user)
        expected = args.expected_revision
        if expected is None:  # compared in the write: an edit in between is refused
            expected = 0 if current is None else current.revision
        email, display = args.email, args.display_name
        if current is not None:  # not given: kept (the budget, though, is replaced)
            email = current.email if email is None else email
            display = current.display_name if display is None else display
        user: User = await store.put_user(
            args.user, limits=limits, email=email or None, display_name=display or None,
            expected_revision=expected)
        return user
    user = _run(args, _put)
    return _answer(args, user, _described(user, verb="set "))


def _described(user: User, *, verb: str = "") -> str:
    return (f"{verb}user {user.name} (revision {user.revision})\n"
            f"email: {user.email or '-'}\n"
            f"display name: {user.display_name or '-'}\n"
            f"budget across teams: {_budget_text(user.limits)}")


# -- parser ---------------------------------------------------------------------------

def _budget_args(parser: argparse.ArgumentParser, what: str, *, whom: str) -> None:
    parser.add_argument("--tokens-per-day", type=_count, metavar="TOKENS",
                        help=f"{what} tokens per UTC day")
    _money_args(parser, what)
    parser.epilog = _FIGURES.format(whom=whom)


def _revision_arg(parser: argparse.ArgumentParser, what: str, *, creates: bool) -> None:
    zero = " (0: only if it does not exist yet)" if creates else ""
    parser.add_argument("--expected-revision", "--if-revision", type=_revision, metavar="N",
                        help=f"refuse unless {what} is still at revision N{zero}, as "
                             "If-Match does on the admin API")


def _register_members(subparsers: Any) -> None:
    sub = command_group(
        subparsers, "members", summary="member budgets: what a user may spend within a team",
        description="Member budgets: what a user (the --user of their keys) may spend "
                    "within one team, on top of the key's and the team's limits. A user "
                    "without a budget of their own gets the team's default member budget, "
                    "each user separately. An edit binds at the next admission of every "
                    "replica.")
    listing = _add(sub, "list", _members_list,
                   "list a team's members: the budget that binds each (SOURCE: member, "
                   "their own; default, the team's default; none, no member cap), how many "
                   "of the team's keys (revoked ones too) name them, the revision of their "
                   "own budget (0: none), and the team's default",
                   "print the admin API's answer to GET /admin/v1/teams/TEAM/members")
    listing.add_argument("team", metavar="TEAM", type=_args.text, help="team name or id")
    put = _add(sub, "set", _members_set,
               "set a user's own budget within a team (created, or replaced as a whole)",
               "print the member's budget as JSON")
    put.add_argument("team", metavar="TEAM", type=_args.text, help="team name or id")
    put.add_argument("user", metavar="USER", type=_member,
                     help="the user (the --user of their keys; '*' is refused: see "
                          "set-default)")
    _budget_args(put, "member", whom="USER within TEAM, on top of the key's and the "
                 "team's limits")
    _revision_arg(put, "the member's budget", creates=True)
    remove = _add(sub, "remove", _members_remove,
                  "remove a user's own budget within a team (the team's default binds them "
                  "again, if it has one)", "print the removed budget as JSON")
    remove.add_argument("team", metavar="TEAM", type=_args.text, help="team name or id")
    remove.add_argument("user", metavar="USER", type=_member, help="the user")
    _revision_arg(remove, "the member's budget", creates=False)
    default = _add(sub, "set-default", _default_set,
                   "set a team's default member budget: each user of the team without a "
                   "budget of their own gets all of it, separately",
                   "print the default member budget as JSON")
    default.add_argument("team", metavar="TEAM", type=_args.text, help="team name or id")
    _budget_args(default, "default member", whom="each user of TEAM without a budget of "
                 "their own, separately (two such users each have all of it)")
    _revision_arg(default, "the default member budget", creates=True)
    undefault = _add(sub, "remove-default", _default_remove,
                     "remove a team's default member budget (users without a budget of "
                     "their own then have no member cap)",
                     "print the removed default as JSON")
    undefault.add_argument("team", metavar="TEAM", type=_args.text, help="team name or id")
    _revision_arg(undefault, "the default member budget", creates=False)


def _register_users(subparsers: Any) -> None:
    sub = command_group(
        subparsers, "users", summary="users: email, display name and a budget across teams",
        description="Users: the people named by the --user of keys, with an email, a "
                    "display name and a budget across every team they hold keys in (on "
                    "top of each team's member budget). An edit binds at the next "
                    "admission of every replica.")
    _add(sub, "list", _users_list, "list users with their email, display name and budget "
         "across teams (REV: the user's revision)", "print JSON")
    show = _add(sub, "show", _users_show, "show one user", "print the user as JSON")
    show.add_argument("user", metavar="USER", type=_user, help="the user's name")
    put = _add(sub, "set", _users_set,
               "create a user or replace their budget across teams (as a whole); the email "
               "and display name are kept unless given",
               "print the user as JSON")
    put.add_argument("user", metavar="USER", type=_user,
                     help="the user's name (the --user of their keys)")
    put.add_argument("--email", type=_label, default=None,
                     help="the user's email ('' removes it; default: keep it)")
    put.add_argument("--display-name", type=_label, default=None, metavar="NAME",
                     help="the user's display name ('' removes it; default: keep it)")
    _budget_args(put, "user", whom="USER across every team they hold keys in, on top of "
                 "each team's member budget")
    _revision_arg(put, "the user", creates=True)


def register(subparsers: Any) -> None:
    _register_members(subparsers)
    _register_users(subparsers)
