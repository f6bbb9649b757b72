"""Roles from an issuer's groups (gateway/roles.py) and the console client's settings:
the first matching role wins, anyone else is a member, a session subject names its role
exactly, and a bad client secret reference fails naming its config key."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from gateway.config import check_secrets, load_settings
from gateway.errors import ConfigError
from gateway.roles import Role, RoleSettings, role_of

ROLES = RoleSettings(admin=["admins"], reader=["finance"], team_lead=["leads"])


@pytest.mark.parametrize(("groups", "role"), [
    (["leads", "finance", "admins"], "admin"), (["leads", "finance"], "reader"),
    (["leads", "eng"], "team_lead"), (["eng"], "member"), ([], "member")])
def test_the_first_matching_role_wins_and_anyone_else_is_a_member(
        groups: list[str], role: str) -> None:
    """admin before reader before team lead; no listed group: member."""
    got = role_of(ROLES, issuer="https://idp", user="a@x", groups=groups, teams=["eng"])
    assert (got.name, got.user, got.teams) == (role, "a@x", ("eng",))


def test_an_issuer_without_roles_makes_members_only() -> None:
    """No ``roles`` on the issuer: even an admins group gives no more than a member."""
    assert role_of(None, issuer="i", user="u", groups=["admins"], teams=[]).name == "member"


def test_a_session_subject_names_its_role_exactly() -> None:
    """The subject parses back to the same role; a token's or key's subject is none."""
    role = Role(name="team_lead", user="l@x", teams=("alpha", "b\"eta"), issuer="https://i")
    assert role.subject().startswith("oidc:") and Role.parse(role.subject()) == role
    assert Role.parse("admin:ops") is None and Role.parse("key:k_1") is None
    assert Role.parse('oidc:["root","u",[],"i"]') is None
    assert (role.tier, Role("member", "u", (), "i").tier, Role("admin", "u", (), "i").tier
            ) == ("read", "key", "write")


def test_a_console_client_secret_reference_is_checked_at_startup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unset env reference of the console's client secret fails naming its key."""
    monkeypatch.delenv("NO_SUCH_CONSOLE_SECRET", raising=False)
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump({"identity": {"issuers": [{
        "issuer": "https://idp.example.com", "audience": ["console"],
        "roles": {"console": {"client_id": "console",
                              "client_secret_ref": "env:NO_SUCH_CONSOLE_SECRET"}}}]}}))
    with pytest.raises(ConfigError, match=r"identity\.issuers\[0\]\.roles\.console\."
                                          r"client_secret_ref"):
        check_secrets(load_settings(path))


def test_an_unknown_role_key_is_refused() -> None:
    """A misspelt role (``team_leads``) is an error naming it, not a silent no-op."""
    with pytest.raises(msgspec.ValidationError, match="team_leads"):
        msgspec.convert({"team_leads": ["x"]}, RoleSettings)
