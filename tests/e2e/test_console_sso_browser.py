"""Console single sign-on and roles, in Debian's Chromium against a real ``mayu serve`` and
a real OIDC provider process (tests/e2e/_oidc.py: npm's oauth2-mock-server), one of each
for the module.

People sign in through the provider (authorization code + PKCE, the console's client
with a secret) and get the role their groups give them: a team lead sees only their
team, a member only their own budget and requests, an admin everything. Every write a
lesser role forges — a console POST with its own session cookie and CSRF token, and the
admin API with its own IdP token as the bearer — is refused and changes nothing. The
admin-token sign-in stays as break-glass and is audited as such. No token, code, client
secret or cookie value is in any file the run wrote.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml

from tests.e2e._browser import chromium
from tests.e2e._oidc import OidcProvider
from tests.e2e._procs import Proc, free_port, start, wait_ready

pytestmark = pytest.mark.e2e

WRITE = "idconsole-e2e-write-token"
CLIENT_SECRET = "idconsole-e2e-client-secret-3f9a"
CONSOLE_ID = "mayu-console"
ISSUER_NAME = "Example IdP"
LEAD = ("lead-1", "lead@example.com", ["leads", "grp-alpha"])
MEMBER = ("mem-1", "mem@example.com", ["grp-alpha"])
ADMIN = ("adm-1", "admin@example.com", ["platform-admins"])
READER = ("fin-1", "fin@example.com", ["finance"])
W = {"Authorization": f"Bearer {WRITE}"}


@dataclass
class Site:
    """The module's gateway, its work dir, and every secret the run handed out."""

    proc: Proc
    work: Path
    request_ids: dict[str, str]
    secrets: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.proc.url


def _chat(site_url: str, key: str, user: str) -> str:
    """One request with ``key`` (of ``user``); its permit id, from the request log."""
    r = httpx.post(f"{site_url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "mock-gpt", "max_tokens": 8,
                         "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert r.status_code == 200, r.text
    log = httpx.get(f"{site_url}/admin/v1/requests", headers=W, params={"user": user}).json()
    [row] = log["data"]
    return str(row["permit_id"])


def _seed(url: str) -> tuple[dict[str, str], list[str]]:
    """Teams alpha and beta; keys of mem@ and other@ in alpha, and of beta, one request
    each; mem@'s own member budget in alpha. The request ids by owner, and the keys."""
    for team in ("alpha", "beta"):
        httpx.post(f"{url}/admin/v1/teams", headers=W, json={"name": team}).raise_for_status()
    owners = (("member", "alpha", MEMBER[1]), ("other", "alpha", "other@example.com"),
              ("beta", "beta", "bob@example.com"))
    keys = {who: httpx.post(f"{url}/admin/v1/keys", headers=W, json={
        "team": team, "user": user}).json()["secret"] for who, team, user in owners}
    httpx.put(f"{url}/admin/v1/teams/alpha/members/{MEMBER[1]}", headers={**W, "If-Match": '"0"'},
              json={"usd_micros_per_day": 4_321_000}).raise_for_status()
    return ({who: _chat(url, keys[who], user) for who, _, user in owners},
            list(keys.values()))


@pytest.fixture(scope="module")
def site(oidc: OidcProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """``mayu serve`` (INFO logs) trusting the provider, with roles by group and the
    console registered as a confidential client."""
    work = tmp_path_factory.mktemp("sso")
    config, port = work / "mayu.yaml", free_port()
    config.write_text(yaml.safe_dump({
        "data_dir": str(work / "data"), "demo": False,
        "server": {"admin_tokens": [{"name": "ops", "token_ref": "env:IDC_WRITE",
                                     "access": "write"}]},
        "identity": {"issuers": [{
            "issuer": oidc.issuer, "audience": [CONSOLE_ID],
            "team_aliases": {"grp-alpha": "alpha", "grp-beta": "beta"},
            "roles": {"admin": ["platform-admins"], "reader": ["finance"],
                      "team_lead": ["leads"],
                      "console": {"client_id": CONSOLE_ID, "name": ISSUER_NAME,
                                  "client_secret_ref": "env:IDC_CLIENT_SECRET",
                                  "redirect_uri": f"http://127.0.0.1:{port}"
                                                  "/console/sso/callback"}}}]}}))
    proc = wait_ready(start(["serve", "--config", str(config), "--port", str(port),
                             "--log-level", "info"], port=port, log_path=work / "gateway.log",
                            env={"IDC_WRITE": WRITE, "IDC_CLIENT_SECRET": CLIENT_SECRET}))
    try:
        ids, keys = _seed(proc.url)
        yield Site(proc=proc, work=work, request_ids=ids,
                   secrets=[WRITE, CLIENT_SECRET, *keys])
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _sso(browser: Any, site: Site, oidc: OidcProvider,
         who: tuple[str, str, list[str]]) -> Any:
    """A fresh browser signed in through the provider's pages as ``who``; its page."""
    sub, email, groups = who
    oidc.sign_in(sub, email=email, groups=groups)
    context = browser.new_context(base_url=site.url)
    context.set_default_timeout(20_000)
    page = context.new_page()

    def seen(request: Any) -> None:  # the code and state the provider sent back
        if "/console/sso/callback" in request.url:
            site.secrets.extend(v for vs in parse_qs(urlsplit(request.url).query).values()
                                for v in vs)
    page.on("request", seen)
    page.goto("/console/login")
    page.get_by_role("link", name=f"Sign in with {ISSUER_NAME}").click()
    page.wait_for_url(re.compile(r"/console/(teams|overview|mine)$"))
    site.secrets.extend(c["value"] for c in context.cookies() if c["value"])
    return page


def _csrf(page: Any) -> str:
    value: str = page.locator('form[action="/console/logout"] input[name="csrf"]'
                              ).get_attribute("value")
    return value


def _teams(site: Site) -> set[str]:
    r = httpx.get(f"{site.url}/admin/v1/teams", headers=W)
    return {t["name"] for t in r.json()["data"]}


def _bearer(oidc: OidcProvider, site: Site, who: tuple[str, str, list[str]]) -> dict[str, str]:
    token = oidc.token(who[0], email=who[1], groups=who[2], aud=CONSOLE_ID)
    site.secrets.append(token)
    return {"Authorization": f"Bearer {token}"}


def test_a_team_lead_signs_in_through_the_provider_and_sees_only_their_team(
        browser: Any, site: Site, oidc: OidcProvider) -> None:
    """A team lead lands on their teams: alpha listed, beta nowhere; alpha's requests,
    keys and usage open filtered to it; beta's page and the unfiltered request log are
    refused; the header names them as a team lead."""
    page = _sso(browser, site, oidc, LEAD)
    assert page.get_by_test_id("who").inner_text() == "lead@example.com (team lead)"
    listed = page.locator("main").inner_text()
    assert "alpha" in listed and "beta" not in listed
    page.goto("/console/teams/alpha")
    assert "other@example.com" in page.locator("main").inner_text()
    for link in ("requests", "keys", "usage"):  # their team's pages, filtered to it
        page.goto("/console/teams/alpha")
        page.locator("[data-team-links]").get_by_role("link", name=link).click()
        page.wait_for_load_state()
        shown = page.content()
        assert "bob@example.com" not in shown and site.request_ids["beta"] not in shown
        assert page.locator("h1").count() == 1 and "Not done" not in shown, link
    page.goto("/console/requests?team=alpha")
    assert site.request_ids["other"] in page.content()
    assert page.goto(f"/console/requests/{site.request_ids['other']}").status == 200
    assert page.goto(f"/console/requests/{site.request_ids['beta']}").status == 404
    for path in ("/console/teams/beta", "/console/requests"):
        answer = page.goto(path)
        assert answer.status == 403, (path, answer.status)
        shown = page.locator("main").inner_text()
        assert "bob@example.com" not in shown and site.request_ids["beta"] not in shown
    page.context.close()


def test_a_team_leads_overview_users_and_operations_show_their_teams_only(
        browser: Any, site: Site, oidc: OidcProvider) -> None:
    """Overview, Users and Operations open for a team lead scoped to their teams: alpha's
    card only, with the figures an admin's alpha card shows (an admin sees beta's too);
    alpha's users with the budget that binds them there, bob@ of beta nowhere; alpha's
    pending permits and liability, without the gateway's status and frozen counters
    (every team's)."""
    admin = _sso(browser, site, oidc, ADMIN)
    assert admin.goto("/console/overview").status == 200
    assert {c.get_attribute("data-team") for c in admin.locator("section[data-team]").all()
            } >= {"alpha", "beta"}
    day = '[data-window="day"] [data-figure="requests"]'
    alpha = admin.locator('section[data-team="alpha"]').locator(day).inner_text()
    admin.context.close()
    page = _sso(browser, site, oidc, LEAD)
    assert page.goto("/console/overview").status == 200
    cards = page.locator("section[data-team]")
    assert cards.count() == 1 and cards.first.get_attribute("data-team") == "alpha"
    assert cards.first.locator(day).inner_text() == alpha and alpha != "0 requests"
    assert page.locator("[data-alerts-scoped]").count() == 1
    assert page.goto("/console/users").status == 200
    assert [t.get_attribute("data-team") for t in page.locator("section[data-team]").all()
            ] == ["alpha"]
    users = {u.get_attribute("data-user") for u in page.locator("tr[data-user]").all()}
    assert users == {MEMBER[1], "other@example.com"}, users
    assert "4,321,000" in page.locator(f'tr[data-user="{MEMBER[1]}"]').inner_text()
    assert page.goto("/console/operations").status == 200
    shown = page.locator("main").inner_text()
    assert page.locator("[data-scoped]").count() == 1 and "Pending permits" in shown
    assert page.locator("[data-status]").count() == 0 and "Frozen" not in shown
    assert "beta" not in shown and "bob@example.com" not in shown
    page.context.close()


def test_a_member_sees_only_their_own_budget_and_requests(
        browser: Any, site: Site, oidc: OidcProvider) -> None:
    """A member lands on their own page: their member budget in alpha and their own
    request, not the request of another user of the same team; admin pages send them
    back to it."""
    page = _sso(browser, site, oidc, MEMBER)
    assert page.url.endswith("/console/mine")
    text = page.locator("main").inner_text()
    assert "4,321,000 µUSD" in text
    html = page.content()
    assert f'data-permit="{site.request_ids["member"]}"' in html
    assert site.request_ids["other"] not in html and site.request_ids["beta"] not in html
    page.goto("/console/overview")
    assert page.url.endswith("/console/mine")
    page.context.close()


def test_an_admin_sees_every_team_and_may_write(browser: Any, site: Site,
                                                oidc: OidcProvider) -> None:
    """An admin lands on Overview with both teams, sees every request, and a team they
    create through the console exists."""
    page = _sso(browser, site, oidc, ADMIN)
    assert page.url.endswith("/console/overview")
    text = page.locator("main").inner_text()
    assert "alpha" in text and "beta" in text
    page.goto("/console/requests")
    assert all(rid in page.content() for rid in site.request_ids.values())
    r = page.context.request.post(f"{site.url}/console/teams", form={
        "csrf": _csrf(page), "name": "made-by-admin"}, max_redirects=0)
    assert r.status == 303 and "made-by-admin" in _teams(site)
    page.context.close()


@pytest.mark.parametrize("who", [LEAD, MEMBER, READER], ids=["lead", "member", "reader"])
def test_every_forged_write_of_a_lesser_role_is_refused(
        browser: Any, site: Site, oidc: OidcProvider, who: tuple[str, str, list[str]]) -> None:
    """With its own session cookie and CSRF token, a team lead's, a member's or a
    reader's console POSTs are 403 and change nothing; with its own IdP token as the
    admin API's bearer, so are its writes; the admin API lets each read only its own."""
    page = _sso(browser, site, oidc, who)
    csrf, post = _csrf(page), page.context.request.post
    before = _teams(site)
    for path, form in (("/console/teams", {"name": f"forged-{who[0]}"}),
                       ("/console/teams/alpha/limits", {"rpm": "1"}),
                       ("/console/keys", {"team": "alpha", "user": who[1]}),
                       ("/console/teams/alpha/default-member", {"usd_micros_per_day": "1"}),
                       ("/console/users", {"user": who[1], "usd_micros_per_day": "1"})):
        r = post(f"{site.url}{path}", form={"csrf": csrf, **form}, max_redirects=0)
        assert r.status == 403, (path, r.status)
    page.context.close()
    bearer = _bearer(oidc, site, who)
    api = httpx.Client(base_url=site.url, headers=bearer, timeout=30)
    assert api.post("/admin/v1/teams", json={"name": f"api-{who[0]}"}).status_code == 403
    assert api.put("/admin/v1/teams/alpha/limits", json={"rpm": 1}).status_code == 403
    assert api.post("/admin/v1/keys", json={"team": "alpha"}).status_code == 403
    assert _teams(site) == before
    alpha = httpx.get(f"{site.url}/admin/v1/teams/alpha", headers=W).json()
    assert alpha["limits"]["rpm"] is None
    if who is READER:
        assert api.get("/admin/v1/teams/beta").status_code == 200
    else:
        assert api.get("/admin/v1/teams/beta").status_code == 403
        assert api.get("/admin/v1/requests").status_code == 403
    if who is LEAD:
        assert {t["name"] for t in api.get("/admin/v1/teams").json()["data"]} == {"alpha"}
        assert api.get("/admin/v1/requests", params={"team": "alpha"}).status_code == 200
    if who is MEMBER:
        own = api.get("/admin/v1/requests", params={"user": MEMBER[1]}).json()["data"]
        assert [r["permit_id"] for r in own] == [site.request_ids["member"]]
        assert api.get("/admin/v1/requests",
                       params={"user": "other@example.com"}).status_code == 403
    api.close()


def test_a_forged_or_foreign_bearer_is_a_401(site: Site, oidc: OidcProvider) -> None:
    """A token for another audience, or one whose payload was edited, is a 401 of the
    admin API, never a role."""
    wrong_aud = oidc.token(ADMIN[0], email=ADMIN[1], groups=ADMIN[2], aud="someone-else")
    head, payload, sig = oidc.token(READER[0], email=READER[1], groups=READER[2],
                                    aud=CONSOLE_ID).split(".")
    site.secrets.extend([wrong_aud, f"{head}.{payload}.{sig}"])
    tampered = f"{head}.{payload[:-4]}AAAA.{sig}"
    for token in (wrong_aud, tampered):
        r = httpx.get(f"{site.url}/admin/v1/teams", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401, r.text


def test_a_callback_not_started_by_this_browser_makes_no_session(site: Site) -> None:
    """A callback without the flow cookie, or with a state not derived from it, is a 400
    and sets no session cookie; the issuer's error is shown and logged reduced to its
    alphabet."""
    with httpx.Client(base_url=site.url) as c:
        start = c.get("/console/sso/0")
        assert start.status_code == 303 and "code_challenge_method=S256" in (
            start.headers["location"])
        flow = c.cookies["inferplane_console_sso"]
        for cookie in (None, flow):
            c.cookies.clear()
            if cookie is not None:
                c.cookies.set("inferplane_console_sso", cookie)
            r = c.get("/console/sso/callback", params={"state": "forged", "code": "x"})
            assert r.status_code == 400, r.text
            assert "inferplane_console=" not in r.headers.get("set-cookie", "")
        c.cookies.set("inferplane_console_sso", flow)
        state = parse_qs(urlsplit(start.headers["location"]).query)["state"][0]
        refused = c.get("/console/sso/callback", params={
            "state": state, "error": "access_denied\nforged log line"})
        assert refused.status_code == 401 and "(access_deniedforgedlogline)" in refused.text
        assert "forged log line" not in site.proc.logs()


def test_an_admin_token_sign_in_is_audited_as_break_glass(browser: Any, site: Site) -> None:
    """The token form still signs in; the audit says "break-glass sign-in" with the
    token's name, never the token."""
    context = browser.new_context(base_url=site.url)
    page = context.new_page()
    page.goto("/console/login")
    page.get_by_label("Admin token or key").fill(WRITE)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/overview$"))
    site.secrets.extend(c["value"] for c in context.cookies() if c["value"])
    context.close()
    audit = "".join(p.read_text() for p in (site.work / "data").rglob("audit*"))
    assert '"break-glass sign-in"' in audit and '"admin:ops"' in audit
    assert "break-glass sign-in with admin token 'ops'" in site.proc.logs()


def test_no_secret_of_the_run_is_in_any_file_it_wrote(site: Site) -> None:
    """Last: every admin token, key, client secret, IdP token, authorization code,
    state and cookie value the run handed out is absent from every file under the
    gateway's work dir (its log at INFO, audit, journal, database)."""
    assert len(site.secrets) > 20
    files = [p for p in site.work.rglob("*") if p.is_file() and p.name != "mayu.yaml"]
    assert any(p.name == "gateway.log" for p in files)
    for path in files:
        data = path.read_bytes()
        for secret in site.secrets:
            assert secret.encode() not in data, (path.name, secret[:6])
