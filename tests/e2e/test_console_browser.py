"""The console in a real headless Chromium (Debian's ``/usr/bin/chromium``, driven by
Playwright; nothing downloaded) against a real ``mayu serve`` (local profile).

An operator with a write token creates a team and a key in the console, sees the secret
once, uses it with the real ``openai`` SDK, finds the request on Requests and its spend
on Overview (the exact µUSD of ``/v1/usage``), rotates and revokes the key; a read
token finds no write control and its forged POST is refused; a cross-site form POST is
refused; an admin adds a member on a team's page and sees the member's spend there equal
to the summary API's; on Users an admin adds and edits a user (each row exactly
``/admin/v1/users/{user}``), a stale edit is a 412 that writes nothing even after a round
of bad input, and the user's key is refused once the user budget is spent; a key holder
sees only their own budget and requests; sign-in works by keyboard alone. Every page is
screenshotted into ``<pytest basetemp>/console-shots`` (or
``$INFERPLANE_TEST_ARTIFACTS/console-shots``) and every test checks that no page loads
anything from outside the gateway.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from playwright import sync_api

from tests.e2e._procs import Proc, start_gateway

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
WRITE, READ = "console-e2e-write-token", "console-e2e-read-token"
PRICE = {"input": 1_000_000, "output": 4_000_000, "cache_read": 100_000,
         "cache_write_5m": 1_250_000, "cache_write_1h": 2_000_000}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """``mayu serve`` (local profile, the in-process mock provider) with a write and a
    read admin token."""
    work = tmp_path_factory.mktemp("console")
    config = {"data_dir": str(work / "data"), "demo": False,
              "server": {"admin_tokens": [
                  {"name": "ops", "token_ref": "env:CONSOLE_E2E_WRITE", "access": "write"},
                  {"name": "finance", "token_ref": "env:CONSOLE_E2E_READ",
                   "access": "read"}]},
              "providers": [{"name": "in-process", "kind": "mock"}],
              "models": [{"name": "gpt-local", "price": PRICE,
                          "deployments": [{"provider": "in-process"}]}]}
    path = work / "mayu.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = start_gateway(path, env={"CONSOLE_E2E_WRITE": WRITE, "CONSOLE_E2E_READ": READ})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Never skipped: the console's Must holds rest on these tests.
    assert shutil.which(CHROMIUM), (f"no {CHROMIUM}: scripts/test installs Debian's chromium "
                                    "with apt-get (as root); the console's browser tests need it")
    with sync_api.sync_playwright() as p:
        # --no-sandbox: the suite may run as root, where Chromium's sandbox cannot start.
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("INFERPLANE_TEST_ARTIFACTS")
    out = (Path(root) if root else tmp_path_factory.getbasetemp()) / "console-shots"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def page(browser: Any, gateway: Proc) -> Iterator[Any]:
    """A fresh browser context (no cookies) on a laptop-sized screen; afterwards, every
    request it made went to the gateway and nowhere else."""
    context = browser.new_context(base_url=gateway.url, viewport={"width": 1280,
                                                                  "height": 900})
    context.set_default_timeout(10_000)
    seen: list[str] = []
    context.on("request", lambda r: seen.append(r.url))
    tab = context.new_page()
    blocked: list[str] = []
    tab.on("console", lambda m: blocked.append(m.text)
           if "Content Security Policy" in m.text else None)
    yield tab
    context.close()
    assert blocked == []  # htmx and our pages run under the console's CSP untouched
    outside = [u for u in seen if not u.startswith(gateway.url)
               and not u.startswith(("data:", "http://attacker.invalid"))]
    assert outside == [], outside


def sign_in(page: Any, credential: str) -> None:
    page.goto("/console/login")
    page.get_by_label("Admin token or key").fill(credential)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/(overview|me)$"))


def api(gateway: Proc, path: str, token: str) -> Any:
    r = httpx.get(f"{gateway.url}{path}", headers={"Authorization": f"Bearer {token}"})
    r.raise_for_status()
    return r.json()


def chat(gateway: Proc, secret: str) -> Any:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=secret, max_retries=0)
    return client.chat.completions.create(
        model="gpt-local", max_tokens=16, messages=[{"role": "user", "content": "hello"}])


def fits(page: Any, selector: str) -> bool:
    """The element shows all its content without a horizontal scroll."""
    return bool(page.locator(selector).first.evaluate(
        "e => e.scrollWidth <= e.clientWidth"))


def money(micros: int) -> str:
    whole, frac = divmod(micros, 1_000_000)
    return f"{micros:,} µUSD (${whole:,}.{frac:06d})"


def test_an_operator_creates_uses_rotates_and_revokes_a_key(page: Any, gateway: Proc,
                                                            shots: Path) -> None:
    """Write token: create a team, edit its limits, create a key (secret once), one
    openai SDK request seen on Requests and on Overview as /v1/usage's exact µUSD,
    rotate (both secrets work during the grace), revoke (the key is refused); no file
    the gateway wrote holds either secret."""
    sign_in(page, WRITE)
    page.goto("/console/teams")
    form = page.locator("#create-team")
    form.get_by_label("Name", exact=True).fill("platform")
    form.get_by_label("Money per UTC day (µUSD)").fill("5000000")
    form.get_by_role("button", name="Create team").click()
    page.wait_for_url(re.compile(r"/console/teams/team_"))
    limits = page.locator("#limits")
    limits.get_by_label("Requests per minute (requests)").fill("600")
    limits.get_by_role("button", name="Save limits").click()
    page.get_by_text("Limits saved (revision 2).").wait_for()
    team = api(gateway, "/admin/v1/teams/platform", READ)
    assert team["limits"]["rpm"] == 600 and team["limits"]["usd_micros_per_day"] == 5_000_000
    page.screenshot(path=shots / "team.png", full_page=True)

    page.goto("/console/keys")
    form = page.locator("#create-key")
    form.get_by_label("Team").select_option("platform")
    form.get_by_label("Name", exact=True).fill("ana laptop")
    form.get_by_label("User (optional)").fill("ana")
    form.get_by_role("button", name="Create key").click()
    secret = page.locator("#secret").inner_text().strip()
    assert secret.startswith("sk-inf-")
    assert page.locator('[data-figure="team"] a').inner_text() == "platform"  # not its id
    assert f"ANTHROPIC_API_KEY={secret}" in page.locator("#env-claude").inner_text()
    assert f"{gateway.url}/v1" in page.locator("#env-codex").inner_text()
    page.screenshot(path=shots / "key-created.png", full_page=True)
    page.goto("/console/keys")
    assert secret not in page.content()
    page.screenshot(path=shots / "keys.png", full_page=True)

    answer = chat(gateway, secret)
    assert answer.choices[0].message.content
    usage = {(r["scope"], r["window"]): r for r in api(gateway, "/v1/usage", secret)["data"]}
    spent = usage[("team", "day")]["usd_committed"]
    assert spent > 0

    page.goto("/console/requests")
    row = page.locator("tbody tr[data-status]").first
    assert row.get_attribute("data-status") == "complete" and "gpt-local" in row.inner_text()
    assert money(spent) in row.locator('[data-figure="usd_committed"]').inner_text()
    assert row.locator("[data-tool]").inner_text() == "openai-python"  # the SDK's own name
    assert fits(page, ".table-wrap")  # every column within the page at 1280 px
    assert row.locator("td.time time").evaluate("e => e.getClientRects().length") == 1
    assert page.get_by_label("Client tool").evaluate("e => e.tagName") == "SELECT"
    page.screenshot(path=shots / "requests.png", full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # the table scrolls
    page.screenshot(path=shots / "requests-phone.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    export = page.get_by_role("link", name="Export these requests as CSV")
    csv = page.request.get(export.get_attribute("href"))
    assert csv.headers["content-type"].startswith("text/csv")
    assert csv.text().splitlines()[0].startswith("permit_id,") and f",{spent}," in csv.text()
    page.get_by_label("Model").fill("no-such-model")  # htmx swaps the table in place
    page.get_by_role("button", name="Filter").click()
    page.get_by_text("No requests match.").wait_for()
    page.wait_for_url(re.compile(r"model=no-such-model"))

    page.goto("/console/overview")
    card = page.locator('section.card[data-team="platform"]')
    day = card.locator('dl[data-window="day"]')
    assert day.locator('[data-figure="usd_committed"]').inner_text() == money(spent)
    assert day.locator('[data-figure="limit"]').inner_text() == money(5_000_000)
    assert day.locator('[data-figure="remaining"]').inner_text() == money(5_000_000 - spent)
    drawn = card.locator('rect[data-part="committed"]').first
    assert float(drawn.get_attribute("width")) == pytest.approx(100 * spent / 5_000_000,
                                                                abs=0.001)
    # No monthly limit: no bar to fill (it was drawn full), the card says so.
    assert card.locator("svg.bar").count() == 1
    assert card.locator("[data-no-limit]").inner_text() == "No month limit: nothing to fill."
    favicon = page.locator('link[rel="icon"]').get_attribute("href")
    assert favicon and page.request.get(favicon).status == 200
    page.screenshot(path=shots / "overview.png", full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=shots / "overview-phone.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})

    page.goto("/console/keys")
    row = page.locator("tr[data-key]").first
    row.get_by_label("Old secret valid for (seconds)").fill("600")
    row.get_by_role("button", name="Rotate").click()
    page.get_by_role("heading", name=re.compile("Key rotated")).wait_for()
    rotated = page.locator("#secret").inner_text().strip()
    assert rotated != secret and rotated.startswith("sk-inf-")
    page.screenshot(path=shots / "key-rotated.png", full_page=True)
    chat(gateway, secret)  # the old secret, within its grace
    chat(gateway, rotated)

    page.goto("/console/keys")
    page.locator("tr[data-key]").first.get_by_role("button", name=re.compile("Revoke")).click()
    page.get_by_text("revoked: it is refused from now on").wait_for()
    assert page.locator("tr[data-key]").first.get_attribute("data-status") == "revoked"
    page.screenshot(path=shots / "key-revoked.png", full_page=True)
    with pytest.raises(openai.AuthenticationError):
        chat(gateway, rotated)
    for written in gateway.log_path.parent.rglob("*"):  # logs, audit, journal, keys
        if written.is_file():
            data = written.read_bytes()
            assert secret.encode() not in data and rotated.encode() not in data, written


def test_an_admin_creates_a_member_and_sees_its_spend_on_the_team_page(
        page: Any, gateway: Proc, shots: Path) -> None:
    """Write token: create a team and, on its page, a member with a $3/day budget; a key
    for that user; one openai SDK request; the member's row shows the budget (own) and
    today's committed/liability equal to the summary API's grouped by user."""
    sign_in(page, WRITE)
    page.goto("/console/teams")
    form = page.locator("#create-team")
    form.get_by_label("Name", exact=True).fill("research")
    form.get_by_role("button", name="Create team").click()
    page.wait_for_url(re.compile(r"/console/teams/team_"))
    team_url = page.url
    add = page.locator("#add-member")
    add.get_by_label("User (the user of their keys)").fill("bo")
    add.get_by_label("Money per UTC day (µUSD)").fill("3000000")
    add.get_by_role("button", name="Add member").click()
    page.get_by_text("Member budget saved.").wait_for()
    member = api(gateway, "/admin/v1/teams/research/members/bo", READ)
    assert member["source"] == "member" and member["revision"] == 1
    assert member["limits"]["usd_micros_per_day"] == 3_000_000

    page.goto("/console/keys")
    form = page.locator("#create-key")
    form.get_by_label("Team").select_option("research")
    form.get_by_label("User (optional)").fill("bo")
    form.get_by_role("button", name="Create key").click()
    secret = page.locator("#secret").inner_text().strip()
    assert chat(gateway, secret).choices[0].message.content

    today = datetime.now(UTC).date().isoformat()
    summary = httpx.get(f"{gateway.url}/admin/v1/requests/summary", params={
        "team": member["team_id"], "group_by": "user", "bucket": "none",
        "since": f"{today}T00:00:00Z"}, headers={"Authorization": f"Bearer {READ}"})
    summary.raise_for_status()
    spent = next(r for r in summary.json()["data"] if r["user"] == "bo")
    assert spent["requests"] == 1 and spent["usd_committed"] > 0

    page.goto(team_url)
    row = page.locator('tr[data-member="bo"]')
    assert row.get_attribute("data-source") == "member"
    assert int(row.get_attribute("data-day-committed")) == spent["usd_committed"]
    assert int(row.get_attribute("data-day-liability")) == spent["usd_liability"]
    text = row.inner_text()
    assert "source: own" in text and money(3_000_000) in text
    assert money(spent["usd_committed"]) in text
    key = page.locator("tr[data-key]").first
    assert key.locator("[data-last-used]").get_attribute("data-last-used")
    page.screenshot(path=shots / "team-members.png", full_page=True)
    assert (shots / "team-members.png").stat().st_size > 0


def test_a_read_token_finds_no_write_control_and_a_forged_post_is_refused(
        page: Any, gateway: Proc, shots: Path) -> None:
    """Read token: no create/edit/rotate/revoke control on any page; a POST built with
    its own session's CSRF token is refused with 403 and changes nothing."""
    sign_in(page, READ)
    for path in ("/console/overview", "/console/teams", "/console/keys",
                 "/console/requests"):
        page.goto(path)
        for name in ("Create team", "Create key", "Rotate", "Save limits"):
            assert page.get_by_role("button", name=name).count() == 0, (path, name)
        assert page.get_by_role("button", name=re.compile("Revoke")).count() == 0
    page.screenshot(path=shots / "keys-read-only.png", full_page=True)
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value")
    before = len(api(gateway, "/admin/v1/teams", READ)["data"])
    r = page.request.post("/console/teams", form={"csrf": csrf, "name": "forged"})
    assert r.status == 403 and "read-only" in r.text()
    assert len(api(gateway, "/admin/v1/teams", READ)["data"]) == before


def test_a_cross_site_form_post_is_refused(page: Any, gateway: Proc) -> None:
    """A page of another site that posts a form to the console while the operator is
    signed in: the SameSite=Strict cookie stays home and the write is refused (403)."""
    sign_in(page, WRITE)
    before = len(api(gateway, "/admin/v1/teams", READ)["data"])
    evil = (f'<form id="f" method="post" action="{gateway.url}/console/teams">'
            '<input name="name" value="evil"><input name="csrf" value="x"></form>'
            '<script>document.getElementById("f").submit()</script>')
    page.route("http://attacker.invalid/", lambda route: route.fulfill(
        status=200, content_type="text/html", body=evil))
    with page.expect_response(f"{gateway.url}/console/teams") as posted:
        page.goto("http://attacker.invalid/")
    assert posted.value.status == 403
    assert len(api(gateway, "/admin/v1/teams", READ)["data"]) == before


def test_a_key_holder_sees_only_its_own_budget_and_requests(page: Any, gateway: Proc,
                                                           shots: Path) -> None:
    """Signed in with a key: My budget is /v1/me's figures, My requests lists exactly
    /v1/me/requests (not another key's), and admin pages lead back to My budget."""
    w = {"Authorization": f"Bearer {WRITE}"}
    for team in ("kh-mine", "kh-other"):
        httpx.post(f"{gateway.url}/admin/v1/teams", headers=w, json={
            "name": team, "limits": {"usd_micros_per_day": 2_000_000}}).raise_for_status()
    mine = httpx.post(f"{gateway.url}/admin/v1/keys", headers=w,
                      json={"team": "kh-mine", "user": "bo"}).json()["secret"]
    other = httpx.post(f"{gateway.url}/admin/v1/keys", headers=w,
                       json={"team": "kh-other"}).json()["secret"]
    own = [chat(gateway, mine).id for _ in range(2)]
    chat(gateway, other)
    me = api(gateway, "/v1/me", mine)

    sign_in(page, mine)
    page.goto("/console/me")
    money_rows = page.locator('section[data-dimension="usd"]')
    assert money_rows.count() >= 1
    first = next(x for x in me["limits"] if x["dimension"] == "usd")
    row = page.locator(f'section[data-counter="{first["counter"]}"]')
    assert row.locator('[data-figure="limit"]').inner_text() == money(first["limit"])
    assert row.locator('[data-figure="committed"]').inner_text() == money(first["committed"])
    drawn = row.locator('rect[data-part="committed"]')
    assert float(drawn.get_attribute("width")) == pytest.approx(
        100 * first["committed"] / first["limit"], abs=0.001)
    page.screenshot(path=shots / "me.png", full_page=True)

    page.goto("/console/me/requests")
    shown = page.locator("tbody tr[data-request]")
    listed = api(gateway, "/v1/me/requests", mine)["data"]
    assert shown.count() == len(listed) == len(own)
    assert {shown.nth(i).get_attribute("data-request") for i in range(shown.count())} == {
        r["request_id"] for r in listed}
    page.screenshot(path=shots / "me-requests.png", full_page=True)
    page.goto("/console/requests")
    assert page.url.endswith("/console/me")


def test_sign_in_and_navigation_work_by_keyboard_alone(page: Any, gateway: Proc) -> None:
    """Tab to the field, type, Enter: signed in; Tab to a nav link, Enter: its page."""
    page.goto("/console/login")
    for _ in range(10):
        if page.evaluate("document.activeElement && document.activeElement.id") == \
                "credential":
            break
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "credential"
    page.keyboard.type(READ)
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/console/overview$"))
    for _ in range(10):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Keys":
            break
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/console/keys$"))


def shown_limit(value: int | None, field: str) -> str:
    """A limit as the console writes it (the test's own spelling, not the console's)."""
    if value is None:
        return "no cap"
    return money(value) if field.startswith("usd") else f"{value:,} tokens/day"


def assert_row_is_the_api(page: Any, gateway: Proc, name: str) -> dict[str, Any]:
    """The user's row on Users shows exactly ``GET /admin/v1/users/{name}``: revision,
    display name, email and every limit; returns that answer."""
    user: dict[str, Any] = api(gateway, f"/admin/v1/users/{name}", READ)
    row = page.locator(f'tr[data-user="{name}"]')
    assert row.get_attribute("data-revision") == str(user["revision"])
    who, budget, revision = (row.locator("td").nth(i).inner_text() for i in range(3))
    assert who.splitlines() == [x for x in (name, user["display_name"], user["email"]) if x]
    assert budget.splitlines() == [f"{f}: {shown_limit(v, f)}"
                                   for f, v in user["limits"].items()]
    assert revision == str(user["revision"])
    return user


def error_next_to(form: Any, label: str) -> str:
    """The message the field labelled ``label`` points at (``aria-describedby``), which
    must be drawn right under it."""
    field = form.get_by_label(label, exact=True)
    assert field.get_attribute("aria-invalid") == "true"
    message = form.locator(f'#{field.get_attribute("aria-describedby")}')
    at, under = field.bounding_box(), message.bounding_box()
    assert abs(under["x"] - at["x"]) < 2 and 0 <= under["y"] - (at["y"] + at["height"]) < 8
    return str(message.inner_text())


def test_an_admin_adds_and_edits_a_user_and_a_stale_edit_writes_nothing(
        page: Any, gateway: Proc, shots: Path) -> None:
    """Write token on Users: add a user ($4/day, an email), the row is exactly
    /admin/v1/users/{user}; edit it; an edit drawn before an API change is the 412 with
    the current figures and writes nothing; a negative or non-number limit is a message
    next to its field (400, not 500) and writes nothing; a key of the user is refused
    once the user budget is spent; a read token sees the page and no form."""
    sign_in(page, WRITE)
    page.get_by_role("link", name="Users").click()
    page.wait_for_url(re.compile(r"/console/users$"))
    add = page.locator("#add-user")
    add.get_by_label("User (the user of their keys)").fill("cy")
    add.get_by_label("Email (optional)").fill("cy@example.com")
    add.get_by_label("Money per UTC day (µUSD)").fill("4,000,000")
    add.get_by_role("button", name="Add user").click()
    page.get_by_text("User cy saved.").wait_for()
    user = assert_row_is_the_api(page, gateway, "cy")
    assert (user["revision"], user["email"], user["display_name"]) == (
        1, "cy@example.com", None)
    assert user["limits"] == {"tokens_per_day": None, "usd_micros_per_day": 4_000_000,
                              "usd_micros_per_month": None}
    page.screenshot(path=shots / "users.png", full_page=True)

    row = page.locator('tr[data-user="cy"]')
    row.get_by_text("Edit", exact=True).click()
    row.get_by_label("Display name (optional)").fill("Cy Young")
    row.get_by_label("Money per UTC month (µUSD)").fill("50000000")
    row.get_by_role("button", name="Save cy").click()
    page.get_by_text("User cy saved.").wait_for()
    user = assert_row_is_the_api(page, gateway, "cy")
    assert (user["revision"], user["display_name"]) == (2, "Cy Young")
    assert user["limits"]["usd_micros_per_month"] == 50_000_000

    row.get_by_text("Edit", exact=True).click()  # drawn at revision 2
    meanwhile = httpx.put(f"{gateway.url}/admin/v1/users/cy", json={
        "email": "cy@example.com", "limits": {"usd_micros_per_day": 5_000_000}},
        headers={"Authorization": f"Bearer {WRITE}", "If-Match": '"2"'})
    assert meanwhile.status_code == 200, meanwhile.text
    row.get_by_label("Money per UTC day (µUSD)").fill("9000000")
    row.get_by_label("Money per UTC month (µUSD)").fill("1.5")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        row.get_by_role("button", name="Save cy").click()
    assert posted.value.status == 400  # a message, and the form stays the one drawn at 2
    row = page.locator('tr[data-user="cy"]')
    assert "whole number" in error_next_to(row, "Money per UTC month (µUSD)")
    row.get_by_label("Money per UTC month (µUSD)").fill("60000000")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        row.get_by_role("button", name="Save cy").click()
    assert posted.value.status == 412
    assert "nothing was changed" in row.get_by_role("alert").inner_text()
    user = assert_row_is_the_api(page, gateway, "cy")
    assert user["revision"] == 3 and user["display_name"] is None
    assert user["limits"] == {"tokens_per_day": None, "usd_micros_per_day": 5_000_000,
                              "usd_micros_per_month": None}
    # The form the 412 opened is drawn from the current figures, ready to retry.
    assert row.get_by_label("Money per UTC day (µUSD)").input_value() == "5000000"
    assert row.get_by_label("Display name (optional)").input_value() == ""
    assert row.locator('input[name="revision"]').input_value() == "3"
    page.screenshot(path=shots / "users-412.png", full_page=True)

    before = api(gateway, "/admin/v1/users", READ)["data"]
    add = page.locator("#add-user")
    add.get_by_label("User (the user of their keys)").fill("dee")
    add.get_by_label("Money per UTC day (µUSD)").fill("-5")
    add.get_by_label("Tokens per UTC day (tokens)").fill("lots")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        add.get_by_role("button", name="Add user").click()
    assert posted.value.status == 400
    add = page.locator("#add-user")
    assert "whole number" in error_next_to(add, "Money per UTC day (µUSD)")
    assert "whole number" in error_next_to(add, "Tokens per UTC day (tokens)")
    assert add.get_by_label("Money per UTC day (µUSD)").input_value() == "-5"  # kept
    page.screenshot(path=shots / "users-bad-input.png", full_page=True)
    assert api(gateway, "/admin/v1/users", READ)["data"] == before

    w = {"Authorization": f"Bearer {WRITE}"}
    httpx.post(f"{gateway.url}/admin/v1/teams", headers=w, json={
        "name": "cy-team"}).raise_for_status()
    secret = httpx.post(f"{gateway.url}/admin/v1/keys", headers=w,
                        json={"team": "cy-team", "user": "cy"}).json()["secret"]
    chat(gateway, secret)
    spent = next(x for x in api(gateway, "/v1/me", secret)["limits"]
                 if x["counter"].startswith("user:cy:usd:day:"))["committed"]
    assert spent > 0
    page.goto("/console/users")  # the user budget cut to what the user has spent
    row = page.locator('tr[data-user="cy"]')
    row.get_by_text("Edit", exact=True).click()
    row.get_by_label("Money per UTC day (µUSD)").fill(str(spent))
    row.get_by_role("button", name="Save cy").click()
    page.get_by_text("User cy saved.").wait_for()
    assert assert_row_is_the_api(page, gateway, "cy")["limits"]["usd_micros_per_day"] == spent
    with pytest.raises(openai.APIStatusError) as refused:
        chat(gateway, secret)
    assert refused.value.status_code == 402, refused.value
    assert "user:cy:usd:day" in str(refused.value)  # the user budget is what refused

    page.get_by_role("button", name="Sign out").click()
    sign_in(page, READ)
    page.goto("/console/users")
    assert_row_is_the_api(page, gateway, "cy")
    assert page.locator('form[action="/console/users"]').count() == 0
    for name in ("Add user", "Save cy"):
        assert page.get_by_role("button", name=name).count() == 0
    assert page.get_by_text("Edit", exact=True).count() == 0
    page.screenshot(path=shots / "users-read-only.png", full_page=True)
    for shot in ("users", "users-412", "users-bad-input", "users-read-only"):
        assert (shots / f"{shot}.png").stat().st_size > 0, shot
