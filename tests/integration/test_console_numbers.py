"""Numbers and times the console reads from forms and queries (local SQLite and shared
Postgres): each bad one is a 400 with a message by its field, never a 500 — a date the
range arithmetic cannot reach, a number of 4,300 digits (Python's int() limit), a digit
that is not ASCII (``²``). Every such number goes through one parser
(``gateway.console._forms.whole_number``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from tests.integration._console import WRITE, Client, console_settings, new_key, sign_in

pytestmark = pytest.mark.integration
HUGE = "9" * 4300


@pytest.fixture(params=["local", "shared"])
async def client(request: pytest.FixtureRequest, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Client]:
    settings = console_settings(request, request.param, tmp_path, monkeypatch)
    async with AsyncTestClient(app=create_app(settings)) as c:
        c.follow_redirects = False
        yield c


@pytest.mark.parametrize("value", ["0001-01-01", "9999-12-31", "0001-01-01T00:00:00+05:00"])
async def test_a_usage_date_out_of_range_is_a_message_by_its_field(
        client: Client, value: str) -> None:
    """``until``/``since`` far in the past or future: 400 under the field, on the
    admin's Usage and on a key holder's My usage."""
    csrf = await sign_in(client, WRITE)
    secret = await new_key(client, csrf)
    for field in ("until", "since"):
        r = await client.get("/console/usage", params={field: value})
        assert r.status_code == 400 and f'data-error-for="{field}"' in r.text, r.text
    client.cookies.clear()
    await sign_in(client, secret)
    for field in ("until", "since"):
        r = await client.get("/console/me/usage", params={field: value})
        assert r.status_code == 400 and f'data-error-for="{field}"' in r.text, r.text


async def test_a_form_number_of_4300_digits_is_a_message_by_its_field(client: Client) -> None:
    """A team limit, a member budget and a user budget of 4,300 digits: 400 beside the
    field (nothing written); a rotation grace of 4,300 digits: refused, not rotated."""
    csrf = await sign_in(client, WRITE)
    r = await client.post("/console/teams", data={"csrf": csrf, "name": "t", "rpm": HUGE})
    assert r.status_code == 400 and 'data-error-for="rpm"' in r.text
    assert "at most" in r.text
    r = await client.post("/console/users", data={"csrf": csrf, "user": "ana",
                                                  "usd_micros_per_day": HUGE})
    assert r.status_code == 400 and 'data-error-for="usd_micros_per_day"' in r.text
    await new_key(client, csrf)
    keys = await client.get("/admin/v1/keys", headers={"Authorization": f"Bearer {WRITE}"})
    key = keys.json()["data"][0]
    r = await client.post(f"/console/keys/{key['key_id']}/rotate",
                          data={"csrf": csrf, "grace_seconds": HUGE, "rotation_id": "r1"})
    assert r.status_code == 303 and "bad_grace" in r.headers["location"]
    again = await client.get("/admin/v1/keys", headers={"Authorization": f"Bearer {WRITE}"})
    assert again.json()["data"][0]["revision"] == key["revision"]


@pytest.mark.parametrize("usd, tokens", [("²", ""), ("12", "³"), (HUGE, ""), ("1", HUGE)])
async def test_a_resolve_figure_that_is_no_whole_number_is_a_message_by_its_permit(
        client: Client, usd: str, tokens: str) -> None:
    """Operations' resolve with ``usd_micros=²`` (a digit, but not ASCII), a
    superscript token count or 4,300 digits: 400 with the message by the permit."""
    csrf = await sign_in(client, WRITE)
    r = await client.post("/console/operations/permits/p-1/resolve",
                          data={"csrf": csrf, "usd_micros": usd, "tokens": tokens})
    assert r.status_code == 400, r.text
    assert 'data-refused="p-1"' in r.text
    assert "whole number" in r.text or "at most" in r.text
