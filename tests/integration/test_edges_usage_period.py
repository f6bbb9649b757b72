"""``GET /v1/usage``: a malformed ``day``/``month`` is a 400 naming the parameter (issue 25).

Both profiles through the real app factory: the local one (SQLite) and the shared one (a
migrated Postgres, where a NUL in the period used to reach the database and come back as
a 503). Litestar's in-process client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config import Settings
from tests.integration._admin import SHARED_STORES
from tests.integration._inapp import in_app

pytestmark = pytest.mark.integration

BAD_DAYS = ["2026\x00", "garbage", "", "2026-12", "2026-12-4", "2026-02-30", "2026-13-01",
            "２０２６-12-04", "2026-12-04\n", "2026-12-04T00:00", " 2026-12-04", "20261204"]
BAD_MONTHS = ["2026\x00", "garbage", "", "2026-12-04", "2026-13", "2026-00", "2026-1",
              "2026-12\n"]


@pytest.fixture(params=["local", "shared"])
async def client(request: pytest.FixtureRequest, tmp_path: Path
                 ) -> AsyncIterator[tuple[AsyncTestClient[Any], str, list[int]]]:
    """A client of a fresh gateway, a key of it, and a list that counts the calls the
    gateway's governance store gets for usage."""
    settings = Settings(data_dir=str(tmp_path), demo=False)
    if request.param == "shared":
        pg_dsn = request.getfixturevalue("pg_dsn")
        request.getfixturevalue("monkeypatch").setenv("INFERPLANE_DATABASE_URL", pg_dsn)
        settings = Settings(data_dir=str(tmp_path), demo=False, **SHARED_STORES)
    app = create_app(settings)
    async with AsyncTestClient(app=app) as c:
        gw = app.state.gateway
        in_app(c, gw.key_store.create_team, name="t")
        key, _ = in_app(c, gw.key_store.create_key, team="t")
        calls: list[int] = []
        usage = gw.governance.usage

        async def counted(**kwargs: Any) -> Any:
            calls.append(1)
            return await usage(**kwargs)

        gw.governance.usage = counted
        yield c, key, calls


async def test_a_malformed_period_is_a_400_naming_it_before_any_store_read(
        client: tuple[AsyncTestClient[Any], str, list[int]]) -> None:
    """Every malformed day (month) — a NUL, garbage, empty, the wrong shape, a date that
    does not exist, non-ASCII digits — is a 400 in the OpenAI error shape whose param is
    the parameter and whose message names the expected format (a NUL: that it holds
    one); the store is never asked; a well-formed period still answers 200 and echoes
    it."""
    c, key, calls = client
    auth = {"Authorization": f"Bearer {key}"}
    cases = [("day", v, "YYYY-MM-DD") for v in BAD_DAYS] + [
        ("month", v, "YYYY-MM") for v in BAD_MONTHS]
    for name, value, shape in cases:
        r = await c.get("/v1/usage", params={name: value}, headers=auth)
        assert r.status_code == 400, (name, value, r.status_code, r.text)
        error = r.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error", "invalid_request", name), (name, value)
        # A NUL byte is refused at the door for every parameter, with its own message.
        expected = ("holds a NUL byte" if "\x00" in value
                    else f"must be a UTC {name} as {shape}")
        assert f"query parameter {name}: {expected}" in error["message"], error["message"]
    # Also before authentication: a missing key with a bad period is still the 400.
    r = await c.get("/v1/usage", params={"day": "2026\x00"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "day"
    assert calls == []
    r = await c.get("/v1/usage", params={"day": "2024-02-29", "month": "2024-02"},
                    headers=auth)
    assert r.status_code == 200, r.text
    assert (r.json()["day"], r.json()["month"]) == ("2024-02-29", "2024-02")
    assert calls == [1]
