"""Console sessions through the real app factory (local SQLite and shared Postgres):
what the cookie carries, what the store keeps, when a session ends, when its cookie is
Secure, and how many failed sign-ins an address may make.

Two apps made from one configuration share one store, as two replicas (or workers) do:
a session made on one is read on the other, and a sign-out on either ends it on both.
Forwarded headers are tested at the ASGI level through the uvicorn configuration
``mayu serve`` runs (``uvicorn_config``), with the peer address set in the scope
(10.1.2.3: no packet goes there); tests/e2e/test_console_sessions_browser.py does it over a
real socket from 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.config import ConsoleSettings, Settings
from gateway.server import uvicorn_config
from tests.integration._console import (
    READ,
    WRITE,
    Client,
    console_settings,
    form_value,
    new_key,
    sign_in,
)

pytestmark = pytest.mark.integration
PROFILES = ["local", "shared"]
_APPS = itertools.count()


async def _app(stack: AsyncExitStack, settings: Settings) -> Client:
    """An app of ``settings`` with a replica id, journal and audit file of its own (so
    several share one store as replicas do)."""
    n = next(_APPS)
    data = Path(settings.data_dir)
    server = replace(settings.server, replica_id=f"replica-{n}",
                     journal_path=str(data / f"journal-{n}.jsonl"),
                     audit_path=str(data / f"audit-{n}.jsonl"))
    app = create_app(replace(settings, server=server))
    c = await stack.enter_async_context(AsyncTestClient(app=app))
    c.follow_redirects = False
    return c


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as s:
        yield s


def _rows(settings: Settings, request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """Every console_sessions row of the gateway's store, as dicts."""
    if settings.shared:
        with psycopg.connect(request.getfixturevalue("pg_dsn")) as conn:
            cur = conn.execute("SELECT * FROM console_sessions")
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    local = sqlite3.connect(Path(settings.data_dir) / "mayu.db")
    local.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in local.execute("SELECT * FROM console_sessions")]
    finally:
        local.close()


async def _signed_out(c: Client, path: str = "/console/overview") -> bool:
    r = await c.get(path)
    return r.status_code == 303 and r.headers["location"] == "/console/login"


@pytest.mark.parametrize("profile", PROFILES)
async def test_the_cookie_is_a_random_session_id_and_the_store_keeps_only_digests(
        profile: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, stack: AsyncExitStack) -> None:
    """The cookie carries a random id (not the credential, nor its base64); the store
    keeps the id's and the credential's SHA-256 with the subject and tier; no page
    shows the credential."""
    settings = console_settings(request, profile, tmp_path, monkeypatch)
    c = await _app(stack, settings)
    await sign_in(c, WRITE)
    cookie = c.cookies["inferplane_console"]
    packed = base64.urlsafe_b64encode(WRITE.encode()).decode().rstrip("=")
    assert WRITE not in cookie and packed not in cookie and len(cookie) >= 43
    for path in ("/console/overview", "/console/teams", "/console/keys"):
        assert WRITE not in (await c.get(path)).text
    [row] = _rows(settings, request)
    assert bytes(row["id_sha256"]) == hashlib.sha256(cookie.encode()).digest()
    assert bytes(row["credential_sha256"]) == hashlib.sha256(WRITE.encode()).digest()
    assert (row["subject"], row["access"], row["ended_at"]) == ("admin:ops", "write", None)
    assert not any(WRITE in str(v) or packed in str(v) for v in row.values())


@pytest.mark.parametrize("profile", PROFILES)
async def test_a_cookie_copied_before_sign_out_is_signed_out_after(
        profile: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, stack: AsyncExitStack) -> None:
    """Sign-out ends the session in the store: the same cookie set again reads no page
    and writes nothing (even with the CSRF token of its pages)."""
    c = await _app(stack, console_settings(request, profile, tmp_path, monkeypatch))
    csrf = await sign_in(c, WRITE)
    copied = c.cookies["inferplane_console"]
    r = await c.post("/console/logout", data={"csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    c.cookies.set("inferplane_console", copied, path="/console")
    assert await _signed_out(c)
    c.cookies.set("inferplane_console", copied, path="/console")
    r = await c.post("/console/teams", data={"csrf": csrf, "name": "after-sign-out"})
    assert r.status_code == 403
    teams = await c.get("/admin/v1/teams", headers={"Authorization": f"Bearer {READ}"})
    assert teams.json()["data"] == []


@pytest.mark.parametrize("profile", PROFILES)
async def test_a_session_made_on_one_replica_works_on_another_and_ends_on_all(
        profile: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, stack: AsyncExitStack) -> None:
    """Two apps on one store: the session made on A reads and writes on B; signed out
    on B, the same cookie is signed out on A."""
    settings = console_settings(request, profile, tmp_path, monkeypatch)
    a, b = await _app(stack, settings), await _app(stack, settings)
    csrf = await sign_in(a, WRITE)
    cookie = a.cookies["inferplane_console"]
    b.cookies.set("inferplane_console", cookie, path="/console")
    assert (await b.get("/console/overview")).status_code == 200
    r = await b.post("/console/teams", data={"csrf": csrf, "name": "made-on-b"})
    assert r.status_code == 303, r.text
    assert "made-on-b" in (await a.get("/console/teams")).text
    r = await b.post("/console/logout", data={"csrf": csrf})
    assert r.status_code == 303
    assert await _signed_out(a)


@pytest.mark.parametrize("profile", PROFILES)
async def test_a_revoked_key_or_a_rotated_out_secret_signs_its_session_out(
        profile: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, stack: AsyncExitStack) -> None:
    """A key holder's session ends when the key is revoked, or when a rotation's grace
    ends for the secret it was made with: the next page is the sign-in form."""
    settings = console_settings(request, profile, tmp_path, monkeypatch)
    admin, holder = await _app(stack, settings), await _app(stack, settings)
    csrf = await sign_in(admin, WRITE)
    for how in ("revoke", "rotate"):
        secret = await new_key(admin, csrf)
        holder.cookies.clear()
        await sign_in(holder, secret)
        assert (await holder.get("/console/me")).status_code == 200
        me = await holder.get("/v1/me", headers={"Authorization": f"Bearer {secret}"})
        key_id = me.json()["key"]["id"]
        auth = {"Authorization": f"Bearer {WRITE}"}
        if how == "revoke":
            r = await admin.post(f"/admin/v1/keys/{key_id}/revoke", headers=auth)
        else:
            r = await admin.post(f"/admin/v1/keys/{key_id}/rotate", headers=auth,
                                 json={"grace_seconds": 0})
        assert r.status_code == 200, r.text
        assert await _signed_out(holder, "/console/me"), how
    assert all(r["ended_at"] is not None for r in _rows(settings, request)
               if r["access"] == "key")


@pytest.mark.parametrize("profile", PROFILES)
async def test_an_admin_token_gone_from_the_config_signs_its_sessions_out(
        profile: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, stack: AsyncExitStack) -> None:
    """A replica whose config no longer has the read token signs its session out (and
    ends it for every replica); the write token's session goes on."""
    before = console_settings(request, profile, tmp_path, monkeypatch)
    after = console_settings(request, profile, tmp_path, monkeypatch, tokens=("ops",))
    old, new = await _app(stack, before), await _app(stack, before)
    await sign_in(old, READ)
    cookie = old.cookies["inferplane_console"]
    gone = await _app(stack, after)
    gone.cookies.set("inferplane_console", cookie, path="/console")
    assert await _signed_out(gone)
    new.cookies.set("inferplane_console", cookie, path="/console")
    assert await _signed_out(new)
    await sign_in(gone, WRITE)
    assert (await gone.get("/console/overview")).status_code == 200


@pytest.mark.parametrize("profile", PROFILES)
async def test_a_session_ends_after_its_idle_and_its_absolute_expiry(
        profile: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, stack: AsyncExitStack) -> None:
    """Unused for ``session_idle_s`` a session is signed out; used all along, it still
    ends ``session_max_s`` after its sign-in."""
    # Wide margins: a page may take a second on a loaded machine.
    console = ConsoleSettings(session_idle_s=2.5, session_max_s=7.0)
    c = await _app(stack, console_settings(request, profile, tmp_path, monkeypatch,
                                           console=console))
    await sign_in(c, WRITE)
    await asyncio.sleep(3.0)
    assert await _signed_out(c)
    await sign_in(c, WRITE)
    signed_at = asyncio.get_running_loop().time()
    while asyncio.get_running_loop().time() - signed_at < 4.0:
        assert (await c.get("/console/teams")).status_code == 200
        await asyncio.sleep(0.5)
    await asyncio.sleep(max(0.0, signed_at + 7.3 - asyncio.get_running_loop().time()))
    assert await _signed_out(c)


def _cookies(r: httpx.Response) -> dict[str, str]:
    """Each Set-Cookie of ``r`` by its name (the whole header value)."""
    return {v.split("=", 1)[0]: v for k, v in r.headers.multi_items() if k == "set-cookie"}


async def _sign_in_via(via: httpx.AsyncClient, credential: str,
                       headers: dict[str, str]) -> httpx.Response:
    """Sign in through ``via`` with ``headers``, passing the sign-in cookie by hand (a
    Secure cookie is not sent back over plain http by a client's cookie jar)."""
    form = await via.get("/console/login", headers=headers)
    nonce = form_value(form.text, "login_csrf")
    return await via.post("/console/login", data={"credential": credential,
                                                  "login_csrf": nonce},
                          headers={**headers, "Cookie": f"inferplane_console_login={nonce}"})


async def _via_server(stack: AsyncExitStack, settings: Settings, peer: str, *,
                      app: Client | None = None) -> httpx.AsyncClient:
    """A client of the app as ``mayu serve`` runs it (uvicorn's configuration, its
    forwarded-header handling included), the peer being ``peer``."""
    client = app or await _app(stack, settings)  # runs the app's lifespan
    config = uvicorn_config(client.app, settings.server, log_level="warning")
    config.load()
    transport = httpx.ASGITransport(app=config.loaded_app, client=(peer, 40000))
    return await stack.enter_async_context(httpx.AsyncClient(
        transport=transport, base_url="http://gateway.test"))


@pytest.mark.parametrize(("trusted", "peer", "secure"), [
    (["10.0.0.0/8"], "10.1.2.3", True), (None, "10.1.2.3", False),
    (None, "127.0.0.1", False), (["127.0.0.1"], "127.0.0.1", True)])
async def test_the_cookie_is_secure_when_a_trusted_proxy_says_https(
        trusted: list[str] | None, peer: str, secure: bool, request: pytest.FixtureRequest,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stack: AsyncExitStack) -> None:
    """X-Forwarded-Proto: https from a proxy of server.trusted_proxies makes both
    console cookies Secure; from any other peer (127.0.0.1 too, with the setting's
    default: none) the header is ignored."""
    settings = console_settings(request, "local", tmp_path, monkeypatch,
                                trusted_proxies=trusted)
    via = await _via_server(stack, settings, peer)
    r = await _sign_in_via(via, WRITE, {"X-Forwarded-Proto": "https"})
    assert r.status_code == 303, r.text
    cookies = _cookies(r)
    assert ("; secure" in cookies["inferplane_console"].lower()) is secure
    via.cookies.clear()
    form = await via.get("/console/login", headers={"X-Forwarded-Proto": "https"})
    assert ("; secure" in _cookies(form)["inferplane_console_login"].lower()) is secure


async def test_secure_cookie_always_sets_secure_over_plain_http(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        stack: AsyncExitStack) -> None:
    """server.console.secure_cookie: always — Secure with no proxy and plain http."""
    settings = console_settings(request, "local", tmp_path, monkeypatch,
                                console=ConsoleSettings(secure_cookie="always"))
    via = await _via_server(stack, settings, "127.0.0.1")
    r = await _sign_in_via(via, WRITE, {})
    assert r.status_code == 303
    assert "; secure" in _cookies(r)["inferplane_console"].lower()


async def test_failed_sign_ins_are_bounded_per_client_address(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        stack: AsyncExitStack, caplog: pytest.LogCaptureFixture) -> None:
    """Past ``sign_in_failures`` refusals within the window an address gets a 429 page
    with Retry-After, even with a good credential; another address (as a trusted proxy
    forwards it) is not held up; each refusal is logged with the address, never with the
    attempted secret. An untrusted peer's X-Forwarded-For changes nothing."""
    console = ConsoleSettings(sign_in_failures=3, sign_in_window_s=60.0)
    settings = console_settings(request, "local", tmp_path, monkeypatch, console=console,
                                trusted_proxies=["10.0.0.0/8"])
    app = await _app(stack, settings)
    via = await _via_server(stack, settings, "10.1.2.3", app=app)
    caplog.set_level(logging.INFO, logger="mayu.console")
    first = {"X-Forwarded-For": "203.0.113.7"}
    guesses = [f"guess-{i}-not-a-token-at-all" for i in range(3)]
    for guess in guesses:
        assert (await _sign_in_via(via, guess, first)).status_code == 401
    limited = await _sign_in_via(via, WRITE, first)
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert "Too many failed sign-ins" in limited.text
    assert (await _sign_in_via(via, WRITE, {"X-Forwarded-For": "203.0.113.8"})
            ).status_code == 303
    logged = caplog.text
    assert "203.0.113.7" in logged and "retry after" in logged
    assert not any(g in logged for g in guesses) and WRITE not in logged
    untrusted = await _via_server(stack, settings, "192.0.2.50", app=app)
    for i in range(3):
        r = await _sign_in_via(untrusted, f"wrong-{i}", {"X-Forwarded-For": f"198.51.100.{i}"})
        assert r.status_code == 401
    r = await _sign_in_via(untrusted, WRITE, {"X-Forwarded-For": "198.51.100.99"})
    assert r.status_code == 429
