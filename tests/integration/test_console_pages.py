"""The console's HTML routes through the real app factory (local profile, in-process).

What a reviewer of a web page asks first: everything is escaped (a team named
``<script>`` is text), a write without the session's CSRF token or with a read token
changes nothing, bad input is a message next to its field (never a 500), a new secret
is on one uncached page only, a key holder never reaches an admin page, sign-out ends
the session. The browser-driven journeys are in tests/e2e/test_console_browser.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from tests.integration._admin import gateway_settings
from tests.integration._console import SECRET, chat, new_key, sign_in
from tests.integration._console import form_value as _csrf

pytestmark = pytest.mark.integration

WRITE, READ = "w" * 8 + "-console-write-token", "r" * 8 + "-console-read-token"
HOSTILE = "<script>alert('x')</script>"
TOKENS = {"ops": ("write", WRITE), "finance": ("read", READ)}
Client = AsyncTestClient[Any]


@pytest.fixture(params=["local", "shared"])
async def client(request: pytest.FixtureRequest, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Client]:
    """A fresh gateway (local: SQLite; shared: a migrated Postgres) with a write token
    and a read token."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=request.param,
                                tokens=TOKENS)
    async with AsyncTestClient(app=create_app(settings)) as c:
        c.follow_redirects = False  # the tests look at each redirect
        yield c


async def test_a_hostile_team_name_is_text_everywhere(client: Client) -> None:
    """A team named ``<script>…`` shows as escaped text on Overview, Teams and its page,
    never as markup."""
    csrf = await sign_in(client, WRITE)
    r = await client.post("/console/teams", data={"csrf": csrf, "name": HOSTILE,
                                                  "usd_micros_per_day": "5000000"})
    assert r.status_code == 303, r.text
    for path in ("/console/overview", "/console/teams", r.headers["location"]):
        page = await client.get(path)
        assert page.status_code == 200
        assert HOSTILE not in page.text
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"


async def test_a_write_without_the_session_csrf_token_changes_nothing(client: Client) -> None:
    """No CSRF token, another session's, or none of a session at all (a cross-site form
    POST, which a SameSite=Strict cookie never accompanies): 403, no team created."""
    csrf = await sign_in(client, WRITE)
    for data in ({"name": "a"}, {"name": "b", "csrf": "0" * 64}):
        r = await client.post("/console/teams", data=data)
        assert r.status_code == 403 and "CSRF" in r.text
    cookies = dict(client.cookies)
    client.cookies.clear()
    r = await client.post("/console/teams", data={"name": "c", "csrf": csrf})
    assert r.status_code == 403
    client.cookies.update(cookies)
    teams = await client.get("/admin/v1/teams", headers={"Authorization": f"Bearer {READ}"})
    assert teams.json()["data"] == []


async def test_the_session_cookie_is_httponly_strict_and_scoped(client: Client) -> None:
    """The credential's cookie: HttpOnly, SameSite=Strict, path /console; never in a URL."""
    form = await client.get("/console/login")
    r = await client.post("/console/login", data={
        "credential": WRITE, "login_csrf": _csrf(form.text, "login_csrf")})
    cookie = next(v for k, v in r.headers.multi_items() if k == "set-cookie"
                  and v.startswith("inferplane_console="))
    assert "HttpOnly" in cookie and "Path=/console" in cookie
    assert "samesite=strict" in cookie.lower() and "secure" not in cookie.lower()  # http
    assert WRITE not in r.headers["location"]


async def test_a_read_token_sees_no_write_control_and_its_forged_post_is_refused(
        client: Client) -> None:
    """A read token's pages have no form that writes; a POST with its own valid CSRF
    token is still refused (and the API would refuse it too): nothing changes."""
    csrf = await sign_in(client, READ)
    for path in ("/console/overview", "/console/teams", "/console/keys"):
        page = await client.get(path)
        assert page.status_code == 200
        assert 'method="post"' not in page.text.replace(
            'method="post" action="/console/logout"', "")
    r = await client.post("/console/teams", data={"csrf": csrf, "name": "forged"})
    assert r.status_code == 403 and "read-only" in r.text
    assert (await client.get("/console/teams")).text.count("forged") == 0


async def test_bad_input_is_a_message_next_to_its_field(client: Client) -> None:
    """A non-number limit, a limit the API refuses, a bad filter: a 4xx page with the
    message beside the field, never a 500."""
    csrf = await sign_in(client, WRITE)
    r = await client.post("/console/teams", data={"csrf": csrf, "name": "t",
                                                  "rpm": "lots"})
    assert r.status_code == 400 and 'data-error-for="rpm"' in r.text
    r = await client.post("/console/teams", data={"csrf": csrf, "name": "t",
                                                  "rpm": str(2**40)})
    assert r.status_code == 400 and 'data-error-for="rpm"' in r.text, r.text
    r = await client.get("/console/requests", params={"since": "yesterday"})
    assert r.status_code == 400 and 'data-error-for="since"' in r.text


async def test_a_new_secret_is_on_one_uncached_page_only(client: Client) -> None:
    """Creating a key answers its secret once (no-store); no later page shows it."""
    csrf = await sign_in(client, WRITE)
    await client.post("/console/teams", data={"csrf": csrf, "name": "platform"})
    r = await client.post("/console/keys", data={"csrf": csrf, "team": "platform",
                                                 "name": "ana's laptop"})
    assert r.status_code == 201, r.text
    assert r.headers["cache-control"] == "no-store"
    secret = re.search(r'id="secret"[^>]*>(sk-inf-[^<]+)<', r.text)
    assert secret
    assert "ANTHROPIC_BASE_URL=" in r.text and "env_key" in r.text
    for path in ("/console/keys", "/console/overview", "/console/teams/platform"):
        assert secret.group(1) not in (await client.get(path)).text


async def test_a_key_holder_sees_only_its_own_pages(client: Client) -> None:
    """Signed in with a key: /console leads to My budget, admin pages redirect there."""
    csrf = await sign_in(client, WRITE)
    await client.post("/console/teams", data={"csrf": csrf, "name": "platform",
                                              "usd_micros_per_day": "1000000"})
    created = await client.post("/console/keys", data={"csrf": csrf, "team": "platform"})
    secret = re.search(r'id="secret"[^>]*>(sk-inf-[^<]+)<', created.text)
    assert secret
    client.cookies.clear()
    await sign_in(client, secret.group(1))
    for path in ("/console/overview", "/console/keys", "/console/requests"):
        r = await client.get(path)
        assert r.status_code == 303 and r.headers["location"] == "/console/me"
    me = await client.get("/console/me")
    assert me.status_code == 200 and "1,000,000 µUSD ($1.000000)" in me.text


async def test_sign_out_ends_the_session(client: Client) -> None:
    """After sign-out the cookie is gone and every page leads to the sign-in form."""
    csrf = await sign_in(client, WRITE)
    r = await client.post("/console/logout", data={"csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    r = await client.get("/console/overview")
    assert r.status_code == 303 and r.headers["location"] == "/console/login"


async def test_a_wrong_credential_is_refused_at_sign_in(client: Client) -> None:
    """An unknown token or key: 401 on the form, no session."""
    form = await client.get("/console/login")
    r = await client.post("/console/login", data={
        "credential": "sk-inf-not-a-key", "login_csrf": _csrf(form.text, "login_csrf")})
    assert r.status_code == 401 and "Not a valid admin token or key" in r.text
    assert "inferplane_console=" not in str(client.cookies)


async def test_a_stale_limits_form_is_a_412_that_changes_nothing(client: Client) -> None:
    """The limits form carries the revision it was drawn from: after someone else's
    edit it is refused (412, the current limits shown) and writes nothing."""
    csrf = await sign_in(client, WRITE)
    await client.post("/console/teams", data={"csrf": csrf, "name": "platform"})
    drawn = await client.get("/console/teams/platform")
    revision = _csrf(drawn.text, "revision")
    other = await client.put("/admin/v1/teams/platform/limits", json={"rpm": 7},
                             headers={"Authorization": f"Bearer {WRITE}"})
    assert other.status_code == 200
    r = await client.post("/console/teams/platform/limits", data={
        "csrf": csrf, "revision": revision, "rpm": "99"})
    assert r.status_code == 412 and "revision 2, not 1" in r.text
    assert 'value="7"' in r.text
    team = await client.get("/admin/v1/teams/platform",
                            headers={"Authorization": f"Bearer {READ}"})
    assert team.json()["limits"]["rpm"] == 7 and team.json()["revision"] == 2
    r = await client.post("/console/teams/platform/limits", data={
        "csrf": csrf, "revision": "2", "rpm": "99", "usd_micros_per_day": "1,500,000"})
    assert r.status_code == 303
    team = await client.get("/admin/v1/teams/platform",
                            headers={"Authorization": f"Bearer {READ}"})
    assert team.json()["limits"]["rpm"] == 99
    assert team.json()["limits"]["usd_micros_per_day"] == 1_500_000


async def test_a_rotate_form_submitted_twice_rotates_once(client: Client) -> None:
    """The rotate form's Idempotency-Key: a double submit answers the same new secret
    and the key's revision goes up by one only."""
    csrf = await sign_in(client, WRITE)
    await client.post("/console/teams", data={"csrf": csrf, "name": "platform"})
    created = await client.post("/console/keys", data={"csrf": csrf, "team": "platform"})
    key_id = re.search(r"<dd>(key_[0-9a-f]+)</dd>", created.text)
    assert key_id
    keys = await client.get("/console/keys")
    rotation = re.search(rf'name="rotation_id" value="([^"]+-{key_id.group(1)})"',
                         keys.text)
    assert rotation
    form = {"csrf": csrf, "rotation_id": rotation.group(1), "grace_seconds": "0"}
    first = await client.post(f"/console/keys/{key_id.group(1)}/rotate", data=form)
    again = await client.post(f"/console/keys/{key_id.group(1)}/rotate", data=form)
    assert first.status_code == again.status_code == 200
    assert first.headers["cache-control"] == "no-store"
    one, two = SECRET.search(first.text), SECRET.search(again.text)
    assert one and two and one.group(1) == two.group(1)
    key = await client.get(f"/admin/v1/keys/{key_id.group(1)}",
                           headers={"Authorization": f"Bearer {READ}"})
    assert key.json()["revision"] == 2


async def test_requests_page_newest_first_with_a_next_page(client: Client) -> None:
    """51 requests: the first page shows the 50 newest, its next-page link the oldest
    one; a filter narrows the rows and is kept in the next-page and CSV links."""
    csrf = await sign_in(client, WRITE)
    await chat(client, await new_key(client, csrf), times=51)
    first = await client.get("/console/requests", params={"model": "mock-gpt"})
    assert first.text.count("<tr data-request=") == 50
    link = re.search(r'href="(/console/requests\?model=mock-gpt&amp;cursor=[0-9a-f]+)"',
                     first.text)
    assert link, first.text
    rest = await client.get(link.group(1).replace("&amp;", "&"))
    assert rest.text.count("<tr data-request=") == 1
    assert 'href="/console/requests.csv?model=mock-gpt"' in first.text
    csv = await client.get("/console/requests.csv", params={"model": "mock-gpt"})
    assert csv.headers["content-type"].startswith("text/csv")
    assert len(csv.text.splitlines()) == 52
    fragment = await client.get("/console/requests", params={"model": "none"},
                                headers={"HX-Request": "true"})
    assert "<html" not in fragment.text and "No requests match." in fragment.text
