"""``/admin/v1``: member budgets (a user's within a team) and users (a user's across teams).

A key's ``user`` names its user. Within its team the user spends under its member budget
(its own row, else the team's default member budget), across every team under its user
budget; both are charged in the same all-or-none admission as the key's and the team's
limits (:func:`gateway.governance.plan_charges`), and bind on every profile: one
Postgres admission in the shared profile, the SQLite file in the local one, each plane's
own store in the lease profile. A member or user edit moves the revision of the teams it
concerns, so an admission planned with the old budget is re-planned, never charged
against it. Same tokens, revisions (``ETag``/``If-Match``; ``If-Match: "0"`` creates
only), audit lines and errors as the team and key routes (:mod:`gateway.admin._routes`).
``mayu members`` and ``mayu users`` (:mod:`gateway.cli._members`) call the same store
functions, ``team_members`` among them for the listing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec
from litestar import Request, Response, Router, delete, get, put
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody

from gateway.admin._access import Caller, read_access, write_access
from gateway.admin._routes import (
    READS,
    WRITES,
    Cursor,
    PageSize,
    error_responses,
    if_match,
)
from gateway.admin._routes import _audit as audit_write
from gateway.admin._routes import _gateway as admin_gateway
from gateway.admin._views import Name, decode_cursor, found, page
from gateway.errors import BadRequest
from gateway.keys import DEFAULT_MEMBER, Label, Member, MemberLimits, TeamMember, User

AnyRequest = Request[Any, Any, Any]


class MemberView(TeamMember, frozen=True, kw_only=True):
    # The key store's TeamMember under the API's own schema name (no docstring: none
    # was ever part of the schema).
    pass


class MemberPage(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[MemberView]
    default: MemberLimits | None
    """The team's default member budget (None: none)."""
    next_cursor: str | None = None


class DefaultMemberView(msgspec.Struct, frozen=True, kw_only=True):
    team_id: str
    limits: MemberLimits
    revision: int
    created_at: datetime | None = None
    updated_at: datetime | None = None


class UserView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    email: str | None
    display_name: str | None
    limits: MemberLimits
    """The user's budget across every team."""
    revision: int
    created_at: datetime | None = None
    updated_at: datetime | None = None


class UserPut(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    email: Label | None = None
    display_name: Label | None = None
    limits: MemberLimits = MemberLimits()


class UserPage(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[UserView]
    next_cursor: str | None = None


def _user_view(user: User) -> UserView:
    return UserView(name=user.name, email=user.email, display_name=user.display_name,
                    limits=user.limits, revision=user.revision, created_at=user.created_at,
                    updated_at=user.updated_at)


def _default_view(member: Member) -> DefaultMemberView:
    return DefaultMemberView(team_id=member.team_id, limits=member.limits,
                             revision=member.revision, created_at=member.created_at,
                             updated_at=member.updated_at)


def _member_view(member: TeamMember) -> MemberView:
    return MemberView(**msgspec.structs.asdict(member))


def _own_view(member: Member) -> MemberView:
    """A member's own budget as the listing shows it (its keys not counted)."""
    return MemberView(team_id=member.team_id, user=member.user, limits=member.limits,
                      source="member", revision=member.revision, keys=0,
                      created_at=member.created_at, updated_at=member.updated_at)


def _tagged(view: Any, revision: int, status: int = 200) -> Response[Any]:
    return Response(view, status_code=status, headers={"ETag": f'"{revision}"'})


# -- members ----------------------------------------------------------------------------

@get("/teams/{team:str}/members", summary="List a team's members and their budgets",
     responses=error_responses(404), guards=[read_access])
async def list_members(request: AnyRequest, team: FromPath[str], cursor: Cursor = None,
                       limit: PageSize = 100) -> MemberPage:
    """Every user with a member budget in the team or holding one of its keys, with the
    budget that binds them (``source``), and the team's default member budget."""
    team_members = await admin_gateway(request).key_store.team_members(team)
    views = [_member_view(m) for m in team_members.members]
    items, next_cursor = page(views, [v.user for v in views], after=decode_cursor(cursor),
                              limit=limit)
    default = team_members.default
    return MemberPage(data=items, default=None if default is None else default.limits,
                      next_cursor=next_cursor)


@get("/teams/{team:str}/members/{user:str}", summary="Get a member's budget",
     responses=error_responses(404), guards=[read_access])
async def get_member(request: AnyRequest, team: FromPath[str],
                     user: FromPath[str]) -> Response[MemberView]:
    """A user unknown to the team (no budget, no key) is a 404."""
    members = (await admin_gateway(request).key_store.team_members(team)).members
    member = found(next((m for m in members if m.user == user), None),
                   f"user {user!r} is not a member of team {team!r}")
    return _tagged(_member_view(member), member.revision)


def _created(body: type) -> dict[int, ResponseSpec]:
    """A PUT's answers: 200 when it replaced, 201 when it created."""
    return {**WRITES, 201: ResponseSpec(body, description="created",
                                        generate_examples=False)}


@put("/teams/{team:str}/members/{user:str}", summary="Set a member's budget",
     responses=_created(MemberView), guards=[write_access])
async def put_member(request: AnyRequest, team: FromPath[str], user: FromPath[Name],
                     data: JSONBody[MemberLimits], caller: Caller) -> Response[MemberView]:
    """Creates or replaces the user's budget within the team (every limit: a limit left
    out is no cap). Binds at the next admission of every replica."""
    gw = admin_gateway(request)
    expected = if_match(request)
    if user == DEFAULT_MEMBER:
        _refuse_default()
    member: Member = await gw.key_store.put_member(
        team, user, limits=data, expected_revision=expected)
    audit_write(gw, caller, "member.put", team_id=member.team_id, user=user,
                revision=member.revision, if_match=expected, limits=data)
    view = _own_view(member)
    return _tagged(view, view.revision, 201 if member.revision == 1 else 200)


@delete("/teams/{team:str}/members/{user:str}", summary="Remove a member's own budget",
        status_code=200, responses=WRITES, guards=[write_access])
async def delete_member(request: AnyRequest, team: FromPath[str],
                        user: FromPath[str], caller: Caller) -> MemberView:
    """The team's default member budget binds the user again (if there is one)."""
    gw = admin_gateway(request)
    expected = if_match(request)
    if user == DEFAULT_MEMBER:
        _refuse_default()
    member: Member = await gw.key_store.delete_member(
        team, user, expected_revision=expected)
    audit_write(gw, caller, "member.delete", team_id=member.team_id, user=user,
                revision=member.revision, if_match=expected)
    return _own_view(member)


def _refuse_default() -> None:
    raise BadRequest("user: '*' is the team's default member budget; use "
                     "/teams/{team}/default-member", param="user")


@get("/teams/{team:str}/default-member", summary="Get a team's default member budget",
     responses=error_responses(404), guards=[read_access])
async def get_default_member(request: AnyRequest,
                             team: FromPath[str]) -> Response[DefaultMemberView]:
    """The budget of each user of the team without a member budget of its own."""
    default = found(await admin_gateway(request).key_store.get_member(team, DEFAULT_MEMBER),
                    f"team {team!r} has no default member budget")
    return _tagged(_default_view(default), default.revision)


@put("/teams/{team:str}/default-member", summary="Set a team's default member budget",
     responses=_created(DefaultMemberView), guards=[write_access])
async def put_default_member(request: AnyRequest, team: FromPath[str],
                             data: JSONBody[MemberLimits],
                             caller: Caller) -> Response[DefaultMemberView]:
    """Each user of the team without a budget of its own gets this budget, separately
    (two users with the default each have all of it)."""
    gw = admin_gateway(request)
    expected = if_match(request)
    member: Member = await gw.key_store.put_member(
        team, DEFAULT_MEMBER, limits=data, expected_revision=expected)
    audit_write(gw, caller, "member.default.put", team_id=member.team_id,
                revision=member.revision, if_match=expected, limits=data)
    return _tagged(_default_view(member), member.revision,
                   201 if member.revision == 1 else 200)


@delete("/teams/{team:str}/default-member", summary="Remove a team's default member budget",
        status_code=200, responses=WRITES, guards=[write_access])
async def delete_default_member(request: AnyRequest,
                                team: FromPath[str], caller: Caller) -> DefaultMemberView:
    gw = admin_gateway(request)
    expected = if_match(request)
    member: Member = await gw.key_store.delete_member(
        team, DEFAULT_MEMBER, expected_revision=expected)
    audit_write(gw, caller, "member.default.delete", team_id=member.team_id,
                revision=member.revision, if_match=expected)
    return _default_view(member)


# -- users ------------------------------------------------------------------------------

@get("/users", summary="List users and their budgets across teams", responses=READS,
     guards=[read_access])
async def list_users(request: AnyRequest, cursor: Cursor = None,
                     limit: PageSize = 100) -> UserPage:
    users: list[User] = await admin_gateway(request).key_store.list_users()
    items, next_cursor = page([_user_view(u) for u in users], [u.name for u in users],
                              after=decode_cursor(cursor), limit=limit)
    return UserPage(data=items, next_cursor=next_cursor)


@get("/users/{user:str}", summary="Get a user", responses=error_responses(404),
     guards=[read_access])
async def get_user(request: AnyRequest, user: FromPath[str]) -> Response[UserView]:
    got = found(await admin_gateway(request).key_store.get_user(user),
                f"user {user!r} does not exist")
    return _tagged(_user_view(got), got.revision)


@put("/users/{user:str}", summary="Create or replace a user and its budget across teams",
     responses=_created(UserView), guards=[write_access])
async def put_user(request: AnyRequest, user: FromPath[Name],
                   data: JSONBody[UserPut], caller: Caller) -> Response[UserView]:
    """Every field is replaced (a limit left out is no cap). The budget binds the user's
    keys in every team at their next admission."""
    gw = admin_gateway(request)
    expected = if_match(request)
    if user == DEFAULT_MEMBER:
        _refuse_default()
    found: User = await gw.key_store.put_user(
        user, limits=data.limits, email=data.email, display_name=data.display_name,
        expected_revision=expected)
    audit_write(gw, caller, "user.put", user=user, revision=found.revision,
                if_match=expected, limits=data.limits)
    return _tagged(_user_view(found), found.revision, 201 if found.revision == 1 else 200)


ROUTES = [Router(path="/admin/v1", tags=["admin"], route_handlers=[
    list_members, get_member, put_member, delete_member, get_default_member,
    put_default_member, delete_default_member, list_users, get_user, put_user])]
BODIES = (MemberView, MemberPage, DefaultMemberView, UserView, UserPut, UserPage,
          MemberLimits)
