"""``/metrics`` stays bounded and private: route templates, a token, team pseudonyms.

Through the real app factory (local profile, SQLite stores, the built-in mock) and
Litestar's in-process client: random paths never add a series, a configured
``server.metrics_token_ref`` is required, and by default a team appears only as a
pseudonym (``gateway.metrics.team_pseudonym``), never by id or name.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import load_settings
from gateway.keys import SqliteKeyStore, TeamLimits
from gateway.metrics import team_pseudonym

pytestmark = pytest.mark.integration

TOKEN = "metrics-token-for-tests-0123456789"
BODY = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items())))
            for family in text_string_to_metric_families(text) for s in family.samples}


async def _app(tmp_path: Path, **server: Any) -> tuple[Litestar, str, str]:
    keys = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await keys.open()
    team = await keys.create_team(name="acme-secret-customer",
                                  limits=TeamLimits(usd_micros_per_day=10_000_000))
    key = (await keys.create_key(team="acme-secret-customer"))[0]
    await keys.close()
    base = load_settings(None)
    settings = msgspec.structs.replace(
        base, data_dir=str(tmp_path), demo=False,
        server=msgspec.structs.replace(base.server, **server))
    return create_app(settings), key, team.id


@pytest.fixture
async def plain(tmp_path: Path) -> AsyncIterator[tuple[AsyncTestClient[Litestar], str, str]]:
    app, key, team_id = await _app(tmp_path)
    async with AsyncTestClient(app=app) as client:
        yield client, key, team_id


async def test_random_paths_leave_the_series_count_unchanged(
        plain: tuple[AsyncTestClient[Litestar], str, str]) -> None:
    """2,000 requests to random unknown paths add no series: the route label is the
    template (``unmatched`` for no route), never the raw path."""
    client, _, _ = plain
    assert (await client.get(f"/{uuid.uuid4().hex}")).status_code == 404  # the one series
    before = series((await client.get("/metrics")).text)
    for _ in range(2_000):
        await client.get(f"/{uuid.uuid4().hex}/{uuid.uuid4().hex}")
    after_text = (await client.get("/metrics")).text
    assert len(series(after_text)) == len(before)
    assert ("mayu_requests_total", (("route", "unmatched"), ("status", "404"))) in series(
        after_text)


async def test_requests_are_labelled_by_route_template(
        plain: tuple[AsyncTestClient[Litestar], str, str]) -> None:
    """A served request is counted under its route template and status."""
    client, key, _ = plain
    r = await client.post("/v1/chat/completions", json=BODY,
                          headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    text = (await client.get("/metrics")).text
    assert ("mayu_requests_total", (("route", "/v1/chat/completions"), ("status", "200"))
            ) in series(text)


async def test_teams_are_pseudonymous_by_default(
        plain: tuple[AsyncTestClient[Litestar], str, str]) -> None:
    """Without metrics_team_labels, no team id or name appears in /metrics; the budget
    gauge is labelled by the team's pseudonym."""
    client, key, team_id = plain
    r = await client.post("/v1/chat/completions", json=BODY,
                          headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    text = (await client.get("/metrics")).text
    assert "acme-secret-customer" not in text and team_id not in text
    budget = {s.labels["team_id"] for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "mayu_budget_utilisation_ratio"}
    assert budget == {team_pseudonym(team_id)}


async def test_team_names_appear_only_when_configured(tmp_path: Path) -> None:
    """server.metrics_team_labels: true labels the gauge with the real id and name."""
    app, key, team_id = await _app(tmp_path, metrics_team_labels=True)
    async with AsyncTestClient(app=app) as client:
        await client.post("/v1/chat/completions", json=BODY,
                          headers={"Authorization": f"Bearer {key}"})
        text = (await client.get("/metrics")).text
    assert f'team="acme-secret-customer",team_id="{team_id}"' in text


async def test_metrics_token_is_required_when_configured(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """With server.metrics_token_ref, /metrics answers 401 without the bearer token or
    with a wrong one, and 200 with it; /healthz stays open."""
    monkeypatch.setenv("IPT_METRICS_TOKEN", TOKEN)
    app, _, _ = await _app(tmp_path, metrics_token_ref="env:IPT_METRICS_TOKEN")
    async with AsyncTestClient(app=app) as client:
        assert (await client.get("/metrics")).status_code == 401
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        good = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert good.status_code == 200 and "mayu_requests_total" in good.text
        assert (await client.get("/healthz")).status_code == 200
