"""The team page's members (budget, source, keys, spend) and their forms, and the keys
table's last use and spend, on both profiles (SQLite and a migrated Postgres).

Every figure on the page is checked against the API answer it must equal; every form's
stale revision (412), bad input and a read token's forged POST write nothing. A form
redrawn after bad input (the team's limits, a member's, the default) still carries the
revision it was drawn from, so fixed and sent again after a change made meanwhile it is
a 412, not an overwrite.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from tests.integration._console import chat
from tests.integration.test_console_pages import (
    READ,
    SECRET,
    WRITE,
    Client,
    _csrf,
    client,
    sign_in,
)

pytestmark = pytest.mark.integration
__all__ = ["client"]  # the fixture, used by name
R = {"Authorization": f"Bearer {READ}"}
W = {"Authorization": f"Bearer {WRITE}"}


def _row(html: str, attr: str, name: str) -> dict[str, str]:
    """The ``data-*`` attributes of the table row ``data-<attr>="<name>"``."""
    found = re.search(rf'<tr data-{attr}="{re.escape(name)}"(.*?)>', html, re.S)
    assert found, html
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', found.group(1)))


async def _team_with_spending_member(c: Client, csrf: str) -> str:
    """Team platform, member ana (own $5/day budget) with one key that made 3 requests."""
    r = await c.post("/console/teams", data={"csrf": csrf, "name": "platform"})
    assert r.status_code == 303, r.text
    r = await c.post("/console/teams/platform/members", data={
        "csrf": csrf, "form": "", "user": "ana", "revision": "0",
        "usd_micros_per_day": "5000000", "usd_micros_per_month": "90,000,000"})
    assert r.status_code == 303, r.text
    created = await c.post("/console/keys", data={"csrf": csrf, "team": "platform",
                                                  "user": "ana"})
    secret = SECRET.search(created.text)
    assert secret
    await chat(c, secret.group(1), times=3)
    return secret.group(1)


async def test_members_and_their_spend_equal_the_api(client: Client) -> None:
    """A member added through the form shows the API's budget, source, key count and
    today's/this month's committed and liability from the summary grouped by user."""
    csrf = await sign_in(client, WRITE)
    await _team_with_spending_member(client, csrf)
    members = (await client.get("/admin/v1/teams/platform/members", headers=R)).json()
    ana = next(m for m in members["data"] if m["user"] == "ana")
    assert ana["source"] == "member" and ana["keys"] == 1
    assert ana["limits"]["usd_micros_per_day"] == 5_000_000
    assert ana["limits"]["usd_micros_per_month"] == 90_000_000
    team_id = ana["team_id"]
    today = datetime.now(UTC).date()
    summary = (await client.get("/admin/v1/requests/summary", headers=R, params={
        "team": team_id, "group_by": "user", "bucket": "none",
        "since": f"{today.isoformat()}T00:00:00Z"})).json()["data"]
    day = next(s for s in summary if s["user"] == "ana")
    assert day["requests"] == 3 and day["usd_committed"] > 0
    page = await client.get("/console/teams/platform")
    row = _row(page.text, "member", "ana")
    assert row["source"] == "member" and row["revision"] == str(ana["revision"])
    assert int(row["day-committed"]) == day["usd_committed"]
    assert int(row["day-liability"]) == day["usd_liability"]
    month = (await client.get("/admin/v1/requests/summary", headers=R, params={
        "team": team_id, "group_by": "user", "bucket": "none",
        "since": f"{today.replace(day=1).isoformat()}T00:00:00Z"})).json()["data"]
    assert int(row["month-committed"]) == next(
        s for s in month if s["user"] == "ana")["usd_committed"]
    assert "5,000,000 µUSD ($5.000000)" in page.text


async def test_keys_show_last_use_and_spend_equal_to_the_api(client: Client) -> None:
    """The keys table's last use is the API's last_used_at; its spend today equals the
    summary grouped by key (on Keys and on the team's page)."""
    csrf = await sign_in(client, WRITE)
    await _team_with_spending_member(client, csrf)
    key = (await client.get("/admin/v1/keys", headers=R)).json()["data"][0]
    assert key["last_used_at"]
    summary = (await client.get("/admin/v1/requests/summary", headers=R, params={
        "group_by": "key", "bucket": "none",
        "since": f"{datetime.now(UTC).date().isoformat()}T00:00:00Z"})).json()["data"]
    spent = next(s for s in summary if s["key_id"] == key["key_id"])
    for path in ("/console/keys", "/console/teams/platform"):
        page = await client.get(path)
        assert page.status_code == 200
        cells = re.search(rf'<tr data-key="{key["key_id"]}".*?</tr>', page.text, re.S)
        assert cells, page.text
        assert f'data-last-used="{key["last_used_at"]}"' in cells.group(0)
        assert f'data-day-committed="{spent["usd_committed"]}"' in cells.group(0)
        assert f'data-month-liability="{spent["usd_liability"]}"' in cells.group(0)


async def test_member_and_default_forms_write_through_the_api(client: Client) -> None:
    """Set a member's budget, remove it (the default binds again), set and remove the
    default: each form's result is what the API then answers."""
    csrf = await sign_in(client, WRITE)
    await _team_with_spending_member(client, csrf)
    r = await client.post("/console/teams/platform/default-member", data={
        "csrf": csrf, "revision": "0", "tokens_per_day": "1000"})
    assert r.status_code == 303, r.text
    default = (await client.get("/admin/v1/teams/platform/default-member", headers=R))
    assert default.json()["limits"]["tokens_per_day"] == 1000
    r = await client.post("/console/teams/platform/members", data={
        "csrf": csrf, "form": "ana", "user": "ana", "revision": "1",
        "usd_micros_per_day": "7000000"})
    assert r.status_code == 303, r.text
    ana = (await client.get("/admin/v1/teams/platform/members/ana", headers=R)).json()
    assert ana["limits"] == {"tokens_per_day": None, "usd_micros_per_day": 7_000_000,
                             "usd_micros_per_month": None} and ana["revision"] == 2
    r = await client.post("/console/teams/platform/members/remove", data={
        "csrf": csrf, "user": "ana", "revision": "2"})
    assert r.status_code == 303, r.text
    page = await client.get("/console/teams/platform")
    assert _row(page.text, "member", "ana")["source"] == "default"
    assert 'data-default-revision="1"' in page.text
    r = await client.post("/console/teams/platform/default-member/remove", data={
        "csrf": csrf, "revision": "1"})
    assert r.status_code == 303, r.text
    page = await client.get("/console/teams/platform")
    assert _row(page.text, "member", "ana")["source"] == "none"
    assert (await client.get("/admin/v1/teams/platform/default-member",
                             headers=R)).status_code == 404


async def test_a_stale_member_form_is_a_412_that_changes_nothing(client: Client) -> None:
    """A member or default form drawn before someone else's edit is refused (412, the
    current figures shown) and writes nothing; adding a member who exists is one too."""
    csrf = await sign_in(client, WRITE)
    await _team_with_spending_member(client, csrf)
    drawn = await client.get("/console/teams/platform")
    assert _row(drawn.text, "member", "ana")["revision"] == "1"
    other = await client.put("/admin/v1/teams/platform/members/ana", headers={
        **W, "If-Match": '"1"'}, json={"usd_micros_per_day": 3_000_000})
    assert other.status_code == 200
    for data in ({"form": "ana", "user": "ana", "revision": "1"},
                 {"form": "", "user": "ana", "revision": "0"}):
        r = await client.post("/console/teams/platform/members", data={
            "csrf": csrf, "usd_micros_per_day": "9000000", **data})
        assert r.status_code == 412 and "nothing was changed" in r.text, r.text
        assert "3,000,000 µUSD" in r.text
    r = await client.post("/console/teams/platform/members/remove", data={
        "csrf": csrf, "user": "ana", "revision": "1"})
    assert r.status_code == 412
    r = await client.post("/console/teams/platform/default-member", data={
        "csrf": csrf, "revision": "3", "tokens_per_day": "5"})
    assert r.status_code == 412
    ana = (await client.get("/admin/v1/teams/platform/members/ana", headers=R)).json()
    assert ana["limits"]["usd_micros_per_day"] == 3_000_000 and ana["revision"] == 2
    assert (await client.get("/admin/v1/teams/platform/default-member",
                             headers=R)).status_code == 404


@pytest.mark.parametrize(("data", "field"), [
    ({"user": "bo", "usd_micros_per_day": "-5"}, "usd_micros_per_day"),
    ({"user": "bo", "tokens_per_day": "1.5"}, "tokens_per_day"),
    ({"user": "bo", "usd_micros_per_month": str(2**70)}, "usd_micros_per_month"),
    ({"user": "", "usd_micros_per_day": "5"}, "user"),
    ({"user": "*", "usd_micros_per_day": "5"}, "user"),
])
async def test_bad_member_input_is_a_message_next_to_its_field(
        client: Client, data: dict[str, str], field: str) -> None:
    """Negative, non-integer, too large, empty or ``*`` user: a 400 with the message
    beside the field, never a 500, and no member created."""
    csrf = await sign_in(client, WRITE)
    await client.post("/console/teams", data={"csrf": csrf, "name": "platform"})
    r = await client.post("/console/teams/platform/members", data={
        "csrf": csrf, "form": "", "revision": "0", **data})
    assert r.status_code == 400, r.text
    assert f'data-error-for="{field}"' in r.text
    members = (await client.get("/admin/v1/teams/platform/members", headers=R)).json()
    assert members["data"] == []
    r = await client.post("/console/teams/platform/default-member", data={
        "csrf": csrf, "revision": "0", **{k: v for k, v in data.items() if k != "user"}})
    assert r.status_code == (303 if field == "user" else 400), r.text


async def test_a_read_token_sees_no_member_form_and_its_forged_post_is_refused(
        client: Client) -> None:
    """A read token's team page shows the members and no form that writes; its POSTs
    (with its own valid CSRF token) are refused and change nothing."""
    wcsrf = await sign_in(client, WRITE)
    await _team_with_spending_member(client, wcsrf)
    client.cookies.clear()
    csrf = await sign_in(client, READ)
    page = await client.get("/console/teams/platform")
    assert page.status_code == 200 and 'data-member="ana"' in page.text
    assert 'method="post"' not in page.text.replace(
        'method="post" action="/console/logout"', "")
    for path, data in (("members", {"user": "ana", "revision": "1"}),
                       ("members", {"user": "eve", "revision": "0"}),
                       ("members/remove", {"user": "ana", "revision": "1"}),
                       ("default-member", {"revision": "0"})):
        r = await client.post(f"/console/teams/platform/{path}", data={
            "csrf": csrf, "usd_micros_per_day": "1", **data})
        assert r.status_code == 403 and "read-only" in r.text
    members = (await client.get("/admin/v1/teams/platform/members", headers=R)).json()
    assert [(m["user"], m["revision"]) for m in members["data"]] == [("ana", 1)]
    assert members["default"] is None
    assert _csrf(page.text)  # the page still carries the session's token for sign-out


async def test_users_page_lists_and_edits_users_like_the_api(client: Client) -> None:
    """Users: add a user with a budget across teams, edit it (If-Match), a stale form is
    a 412 that writes nothing, bad input a message by its field; the page's figures are
    the API's; a read token sees no form and its forged POST is refused."""
    csrf = await sign_in(client, WRITE)
    r = await client.post("/console/users", data={
        "csrf": csrf, "form": "", "revision": "0", "user": "ana",
        "email": "ana@example.com", "tokens_per_day": "5,000,000"})
    assert r.status_code == 303, r.text
    ana = (await client.get("/admin/v1/users/ana", headers=R)).json()
    assert ana["email"] == "ana@example.com" and ana["revision"] == 1
    assert ana["limits"]["tokens_per_day"] == 5_000_000
    page = await client.get("/console/users")
    assert 'data-user="ana" data-revision="1"' in page.text
    assert "5,000,000 tokens/day" in page.text
    r = await client.post("/console/users", data={
        "csrf": csrf, "form": "ana", "revision": "1", "user": "ana",
        "email": "ana@example.com", "usd_micros_per_day": "2000000"})
    assert r.status_code == 303, r.text
    r = await client.post("/console/users", data={
        "csrf": csrf, "form": "ana", "revision": "1", "user": "ana",
        "usd_micros_per_day": "9"})
    assert r.status_code == 412 and "2,000,000 µUSD" in r.text, r.text
    for data, field in (({"user": "bo", "usd_micros_per_day": "-1"}, "usd_micros_per_day"),
                        ({"user": "*"}, "user"), ({"user": ""}, "user"),
                        ({"user": "bo", "tokens_per_day": str(2**70)}, "tokens_per_day")):
        r = await client.post("/console/users", data={
            "csrf": csrf, "form": "", "revision": "0", **data})
        assert r.status_code == 400 and f'data-error-for="{field}"' in r.text, r.text
    users = (await client.get("/admin/v1/users", headers=R)).json()["data"]
    assert [(u["name"], u["revision"], u["limits"]["usd_micros_per_day"])
            for u in users] == [("ana", 2, 2_000_000)]
    client.cookies.clear()
    rcsrf = await sign_in(client, READ)
    page = await client.get("/console/users")
    assert 'data-user="ana"' in page.text
    assert 'method="post"' not in page.text.replace(
        'method="post" action="/console/logout"', "")
    r = await client.post("/console/users", data={"csrf": rcsrf, "user": "eve",
                                                  "revision": "0"})
    assert r.status_code == 403 and "read-only" in r.text
    assert len((await client.get("/admin/v1/users", headers=R)).json()["data"]) == 1


@dataclass(frozen=True)
class _Drawn:
    """One form of the team's page, and the API record it edits."""

    marks: str  # a string only this form's HTML holds
    action: str  # where it posts, under /console/teams/platform
    sent: dict[str, str]  # what it sends besides the CSRF token and the revision
    bad: tuple[str, str]  # a field and a value the console refuses (400)
    good: dict[str, str]  # a valid edit
    api: str  # the record under /admin/v1/teams/platform (PUT there too; limits: /limits)
    change: dict[str, int]  # the change made through the API meanwhile
    shown: str  # how the page shows that change


_STALE = {
    "team limits": _Drawn(
        'id="limits"', "limits", {}, ("rpm", "lots"), {"rpm": "99"},
        "", {"rpm": 7}, 'name="rpm" type="text" value="7"'),
    "member budget": _Drawn(
        'name="form" value="ana"', "members", {"form": "ana", "user": "ana"},
        ("usd_micros_per_day", "-5"), {"usd_micros_per_day": "9000000"},
        "/members/ana", {"usd_micros_per_day": 3_000_000}, "3,000,000 µUSD ($3.000000)"),
    "default member budget": _Drawn(
        'id="default-form"', "default-member", {}, ("tokens_per_day", "1.5"),
        {"tokens_per_day": "5"}, "/default-member", {"tokens_per_day": 7}, "7 tokens/day"),
}


def _form(html: str, marks: str) -> str:
    """The one ``<form>…</form>`` of the page that holds ``marks``."""
    forms = [f.group(0) for f in re.finditer(r"<form\b.*?</form>", html, re.S)
             if marks in f.group(0)]
    assert len(forms) == 1, html
    return forms[0]


def _shown(html: str, drawn: _Drawn) -> str:
    """The part of the page that shows the record: the limits form, the member's row,
    the default's paragraph."""
    if drawn.action == "limits":
        return _form(html, drawn.marks)
    found = re.search(r'<tr data-member="ana".*?</tr>' if drawn.action == "members"
                      else r"<p data-default-revision.*?</p>", html, re.S)
    assert found, html
    return found.group(0)


@pytest.mark.parametrize("which", list(_STALE))
async def test_a_form_redrawn_after_bad_input_keeps_its_revision(
        client: Client, which: str) -> None:
    """A form drawn at revision N, changed through the API meanwhile (N+1): bad input is
    a 400 by the field with N still in the form; fixed and sent again, it is a 412 with
    the current figures, and nothing is written."""
    drawn = _STALE[which]
    csrf = await sign_in(client, WRITE)
    await client.post("/console/teams", data={"csrf": csrf, "name": "platform"})
    for path, data in (("members", {"form": "", "user": "ana", "revision": "0",
                                    "usd_micros_per_day": "5000000"}),
                       ("default-member", {"revision": "0", "tokens_per_day": "1000"})):
        r = await client.post(f"/console/teams/platform/{path}", data={"csrf": csrf, **data})
        assert r.status_code == 303, r.text
    form = _form((await client.get("/console/teams/platform")).text, drawn.marks)
    n = _csrf(form, "revision")
    record = f"/admin/v1/teams/platform{drawn.api}"
    other = await client.put(record + ("/limits" if drawn.action == "limits" else ""),
                             headers={**W, "If-Match": f'"{n}"'}, json=drawn.change)
    assert other.status_code == 200 and other.json()["revision"] == int(n) + 1, other.text
    field, value = drawn.bad
    r = await client.post(f"/console/teams/platform/{drawn.action}", data={
        "csrf": csrf, "revision": _csrf(form, "revision"), **drawn.sent, field: value})
    assert r.status_code == 400, r.text
    form = _form(r.text, drawn.marks)
    assert f'data-error-for="{field}"' in form and f'value="{value}"' in form
    assert _csrf(form, "revision") == n
    r = await client.post(f"/console/teams/platform/{drawn.action}", data={
        "csrf": csrf, "revision": _csrf(form, "revision"), **drawn.sent, **drawn.good})
    assert r.status_code == 412 and "nothing was changed" in r.text, r.text
    assert drawn.shown in _shown(r.text, drawn)
    # The form is drawn again with the current figures and revision: sent as shown, it
    # keeps the change it was refused for (never a blank budget at the new revision).
    form = _form(r.text, drawn.marks)
    assert _csrf(form, "revision") == str(int(n) + 1)
    for name, figure in drawn.change.items():
        assert re.search(rf'name="{name}"[^>]* value="{figure}"', form), form
    assert (await client.get(record, headers=R)).json() == other.json()
