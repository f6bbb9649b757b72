"""Console sessions in a real headless Chromium (Debian's ``/usr/bin/chromium`` via
Playwright) against a real ``mayu serve`` (local profile), and its cookies and sign-in
limit over a real socket from 127.0.0.1.

Sign-in works and the browser's cookie is a session id, not the credential; a cookie
copied before sign-out, set again in a fresh browser after it, is signed out; a key's
session is signed out once the key is revoked; a gateway with short expiries (seconds)
signs a session out when it sits idle, and when its absolute expiry comes however busy
it is. From 127.0.0.1 as a configured proxy, ``X-Forwarded-Proto: https`` makes the
cookie Secure (and is ignored by a gateway that trusts no proxy); failed sign-ins of a
forwarded address end in a 429 with Retry-After, logged without the attempted secret.
"""

from __future__ import annotations

import base64
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from playwright import sync_api

from tests.e2e._procs import Proc, start_gateway

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
WRITE, READ = "sessions-e2e-write-token", "sessions-e2e-read-token"
IDLE_S, MAX_S = 6.0, 18.0
"""Wide margins: a page may take seconds in a browser on a loaded machine."""


def _gateway(work: Path, name: str, server: dict[str, Any]) -> Proc:
    config = {"data_dir": str(work / name), "demo": False,
              "server": {"admin_tokens": [
                  {"name": "ops", "token_ref": "env:SESSIONS_E2E_WRITE", "access": "write"},
                  {"name": "finance", "token_ref": "env:SESSIONS_E2E_READ",
                   "access": "read"}], **server}}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return start_gateway(path, env={"SESSIONS_E2E_WRITE": WRITE, "SESSIONS_E2E_READ": READ})


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """Default expiries; 127.0.0.1 is a trusted proxy; 3 failed sign-ins per address."""
    proc = _gateway(tmp_path_factory.mktemp("sessions"), "proxied", {
        "trusted_proxies": ["127.0.0.1"],
        "console": {"sign_in_failures": 3, "sign_in_window_s": 120}})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """Sessions idle out after IDLE_S and end MAX_S after sign-in; no trusted proxy."""
    proc = _gateway(tmp_path_factory.mktemp("sessions"), "short", {
        "console": {"session_idle_s": IDLE_S, "session_max_s": MAX_S}})
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert shutil.which(CHROMIUM), f"no {CHROMIUM}: the console's browser tests need it"
    with sync_api.sync_playwright() as p:
        # --no-sandbox: the suite may run as root, where Chromium's sandbox cannot start.
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        yield chromium
        chromium.close()


def _context(browser: Any, proc: Proc) -> Any:
    context = browser.new_context(base_url=proc.url)
    context.set_default_timeout(15_000)
    return context


def sign_in(page: Any, credential: str) -> None:
    page.goto("/console/login")
    page.get_by_label("Admin token or key").fill(credential)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/(overview|me)$"))


def _signed_out(page: Any, path: str = "/console/overview") -> bool:
    page.goto(path)
    url: str = page.url
    return url.endswith("/console/login")


def test_sign_in_gives_the_browser_a_session_id_not_the_credential(
        browser: Any, gateway: Proc) -> None:
    """Signed in by the form: the browser holds an HttpOnly, SameSite=Strict cookie of
    a random id in which the token is nowhere (nor its base64), and no page shows it."""
    context = _context(browser, gateway)
    page = context.new_page()
    sign_in(page, WRITE)
    [cookie] = [c for c in context.cookies() if c["name"] == "inferplane_console"]
    packed = base64.urlsafe_b64encode(WRITE.encode()).decode().rstrip("=")
    assert WRITE not in cookie["value"] and packed not in cookie["value"]
    assert len(cookie["value"]) >= 43
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/console"
    assert WRITE not in page.content()
    assert page.get_by_test_id("who").inner_text() == "admin token “ops” (write)"
    context.close()


def test_a_cookie_copied_before_sign_out_is_signed_out_after(browser: Any,
                                                              gateway: Proc) -> None:
    """A copy of the cookie works in a fresh browser before sign-out; after the first
    browser signs out, the same copy in another fresh browser leads to the sign-in form."""
    first = _context(browser, gateway)
    page = first.new_page()
    sign_in(page, WRITE)
    copied = [c for c in first.cookies() if c["name"] == "inferplane_console"]
    before = _context(browser, gateway)
    before.add_cookies(copied)
    assert not _signed_out(before.new_page())
    before.close()
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/console/login$"))
    first.close()
    after = _context(browser, gateway)
    after.add_cookies(copied)
    assert _signed_out(after.new_page())
    after.close()


def test_a_revoked_key_s_session_is_signed_out(browser: Any, gateway: Proc) -> None:
    """A key holder signed in on My budget: once the key is revoked through the API,
    their next page is the sign-in form."""
    w = {"Authorization": f"Bearer {WRITE}"}
    httpx.post(f"{gateway.url}/admin/v1/teams", headers=w,
               json={"name": "revoked-later"}).raise_for_status()
    made = httpx.post(f"{gateway.url}/admin/v1/keys", headers=w,
                      json={"team": "revoked-later"}).json()
    context = _context(browser, gateway)
    page = context.new_page()
    sign_in(page, made["secret"])
    assert not _signed_out(page, "/console/me")
    httpx.post(f"{gateway.url}/admin/v1/keys/{made['key']['key_id']}/revoke",
               headers=w).raise_for_status()
    assert _signed_out(page, "/console/me")
    context.close()


def test_a_session_idles_out_and_ends_at_its_absolute_expiry(browser: Any,
                                                             short: Proc) -> None:
    """Left alone longer than the idle expiry: signed out. Used every second: still
    signed out once the absolute expiry after sign-in has come."""
    context = _context(browser, short)
    page = context.new_page()
    sign_in(page, READ)
    time.sleep(IDLE_S + 1.5)
    assert _signed_out(page)
    sign_in(page, READ)
    signed_at = time.monotonic()
    while time.monotonic() - signed_at < MAX_S - 6.0:
        assert not _signed_out(page), time.monotonic() - signed_at
        time.sleep(1.0)
    time.sleep(max(0.0, signed_at + MAX_S + 0.5 - time.monotonic()))
    assert _signed_out(page)
    context.close()


def _sign_in_over_http(proc: Proc, credential: str,
                       headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=proc.url, headers=headers) as c:
        form = c.get("/console/login")
        nonce = re.search(r'name="login_csrf" value="([^"]+)"', form.text)
        assert nonce, form.text
        return c.post("/console/login", data={"credential": credential,
                                              "login_csrf": nonce.group(1)},
                      headers={"Cookie": f"inferplane_console_login={nonce.group(1)}"})


def _session_cookie(r: httpx.Response) -> str:
    return next(v for k, v in r.headers.multi_items()
                if k == "set-cookie" and v.startswith("inferplane_console="))


def test_x_forwarded_proto_from_a_trusted_proxy_makes_the_cookie_secure(
        gateway: Proc, short: Proc) -> None:
    """Over a real socket from 127.0.0.1: with 127.0.0.1 in server.trusted_proxies,
    X-Forwarded-Proto: https gives a Secure cookie; a gateway that trusts no proxy
    ignores the header (no Secure over plain http)."""
    https = {"X-Forwarded-Proto": "https"}
    trusted = _sign_in_over_http(gateway, WRITE, https)
    assert trusted.status_code == 303
    assert "; secure" in _session_cookie(trusted).lower()
    ignored = _sign_in_over_http(short, WRITE, https)
    assert ignored.status_code == 303
    assert "; secure" not in _session_cookie(ignored).lower()


def test_failed_sign_ins_of_an_address_end_in_a_429(gateway: Proc) -> None:
    """Three wrong credentials forwarded for one address, then a 429 with Retry-After
    (even for the right one) while another address signs in; the log names the address
    and never a typed secret."""
    one, other = {"X-Forwarded-For": "203.0.113.20"}, {"X-Forwarded-For": "203.0.113.21"}
    guesses = [f"e2e-guess-{i}-wrong-credential" for i in range(3)]
    for guess in guesses:
        assert _sign_in_over_http(gateway, guess, one).status_code == 401
    limited = _sign_in_over_http(gateway, WRITE, one)
    assert limited.status_code == 429 and "Too many failed sign-ins" in limited.text
    assert 1 <= int(limited.headers["retry-after"]) <= 120
    assert _sign_in_over_http(gateway, WRITE, other).status_code == 303
    logs = gateway.logs()
    assert "203.0.113.20" in logs
    assert not any(g in logs for g in guesses) and WRITE not in logs
