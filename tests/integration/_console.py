"""What the console's integration tests share: a gateway's settings with a write and a
read admin token (local SQLite or shared Postgres), and signing in through the form."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.config import Settings
from tests.integration._admin import gateway_settings

WRITE, READ = "w" * 8 + "-console-write-token", "r" * 8 + "-console-read-token"
SECRET = re.compile(r'id="secret"[^>]*>(sk-inf-[^<]+)<')
Client = AsyncTestClient[Any]


def console_settings(request: pytest.FixtureRequest, profile: str, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch, *,
                     console: Any = None,
                     trusted_proxies: list[str] | None = None,
                     tokens: tuple[str, ...] = ("ops", "finance")) -> Settings:
    """A gateway of ``profile`` (``local``: one SQLite file in ``tmp_path``; ``shared``:
    the test's Postgres database) with the admin tokens ``tokens`` (``ops`` writes,
    ``finance`` reads). Two apps made from it share one store, as two replicas do."""
    every = {"ops": ("write", WRITE), "finance": ("read", READ)}
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=profile,
                                tokens={t: every[t] for t in tokens})
    changes: dict[str, Any] = {}
    if console is not None:
        changes["console"] = console
    if trusted_proxies is not None:
        changes["trusted_proxies"] = trusted_proxies
    return replace(settings, server=replace(settings.server, **changes))


def form_value(html: str, name: str = "csrf") -> str:
    found = re.search(rf'name="{name}" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


async def sign_in(c: Client, credential: str) -> str:
    """Sign in through the form; the CSRF token of the session's pages."""
    form = await c.get("/console/login")
    r = await c.post("/console/login", data={"credential": credential,
                                             "login_csrf": form_value(form.text,
                                                                      "login_csrf")})
    assert r.status_code == 303, r.text
    home = await c.get("/console/")
    page = await c.get(home.headers["location"])
    assert page.status_code == 200, page.text
    return form_value(page.text)


async def new_key(c: Client, csrf: str, team: str = "platform") -> str:
    """A team (if need be) and a key of it, made through the console: the secret."""
    await c.post("/console/teams", data={"csrf": csrf, "name": team})
    created = await c.post("/console/keys", data={"csrf": csrf, "team": team})
    secret = SECRET.search(created.text)
    assert secret, created.text
    return secret.group(1)


async def chat(c: Client, key: str, *, times: int = 1) -> None:
    """``times`` small chat completions (the mock's gpt) with ``key``, each a 200."""
    for _ in range(times):
        r = await c.post("/v1/chat/completions", json={
            "model": "mock-gpt", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
