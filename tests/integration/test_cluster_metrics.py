"""The ``mayu_cluster_*`` gauges: the database's figures, read at scrape and cached.

The shared-profile app is built by the real factory on a fresh migrated database;
figures are written through the real governance store (admissions and settlements),
then ``/metrics`` is scraped through the app.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import (
    ServerSettings,
    Settings,
)
from gateway.db import Pool
from gateway.governance import (
    Outcome,
    OutcomeKind,
    PostgresGovernanceStore,
)
from gateway.keys import KeyLimits, PostgresKeyStore, TeamLimits, hash_key
from gateway.metrics import team_pseudonym
from tests.integration._admin import SHARED_STORES
from tests.integration._pg_helpers import principal
from tests.settling import exact, spend

pytestmark = pytest.mark.integration



def _settings(tmp_path: Path, *, team_labels: bool) -> Settings:
    return Settings(data_dir=str(tmp_path), demo=False,
                    server=ServerSettings(metrics_team_labels=team_labels), **SHARED_STORES)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def _figures(pool: Pool) -> tuple[str, str]:
    """Team 'alpha' (day 10,000 µUSD, month 100,000): 5,000 committed, 1,000 liability,
    2,000 reserved by a pending permit; its key's day limit 40,000 sees the same; team
    'beta' (day 9,000) is frozen by invalid usage. Returns (team id, key id)."""
    keys, gov = PostgresKeyStore(pool), PostgresGovernanceStore(pool)
    await keys.create_team(name="alpha", limits=TeamLimits(usd_micros_per_day=10_000,
                                                           usd_micros_per_month=100_000))
    plaintext, _ = await keys.create_key(team="alpha",
                                         limits=KeyLimits(usd_micros_per_day=40_000))
    alpha = await keys.resolve(hash_key(plaintext))
    assert alpha is not None
    beta = await principal(keys, team="beta", limits=TeamLimits(usd_micros_per_day=9_000))

    for who, usd, outcome in (
            (alpha, 5_000, exact(5, 5_000)),
            (alpha, 1_000, Outcome(kind=OutcomeKind.UNCERTAIN, detail="cut")),
            (alpha, 2_000, None),
            (beta, 100, Outcome(kind=OutcomeKind.INVALID, detail="negative"))):
        # Today's windows, as the scrape reads them (not the day the module was imported).
        await spend(gov, who, usd, outcome, now=datetime.now(UTC), tokens=10)
    return alpha.team.id, alpha.key_id


async def _scrape(app: Litestar) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with AsyncTestClient(app=app) as client:
        return _samples((await client.get("/metrics")).text)


async def test_cluster_gauges_show_the_database_figures(
        tmp_path: Path, pg_dsn: str, pg_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per budget and window: committed, liability and reserved over the limit, and the
    limit; pending permits and frozen counters — with pseudonymous ids by default."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    team_id, key_id = await _figures(pg_pool)
    got = await _scrape(create_app(_settings(tmp_path, team_labels=False)))

    def ratio(scope: str, ident: str, window: str, figure: str) -> float:
        labels = (("figure", figure), ("id", ident), ("scope", scope), ("team", ""),
                  ("window", window))
        return got[("mayu_cluster_budget_utilisation_ratio", labels)]

    team = team_pseudonym(team_id)
    assert ratio("team", team, "day", "committed") == 0.5
    assert ratio("team", team, "day", "liability") == 0.1
    assert ratio("team", team, "day", "reserved") == 0.2
    assert ratio("team", team, "month", "committed") == 0.05
    assert ratio("key", team_pseudonym(key_id), "day", "committed") == 0.125
    assert got[("mayu_cluster_budget_limit_micro_usd", (
        ("id", team), ("scope", "team"), ("team", ""), ("window", "day")))] == 10_000
    assert got[("mayu_cluster_pending_permits", ())] == 1
    assert got[("mayu_cluster_oldest_pending_permit_seconds", ())] > 0
    assert got[("mayu_cluster_frozen_counters", ())] == 1
    assert not any(team_id in str(k) for k in got)  # no team id in cleartext


async def test_team_labels_show_ids_and_names(
        tmp_path: Path, pg_dsn: str, pg_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With server.metrics_team_labels the real team id and name label a team budget."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    team_id, _ = await _figures(pg_pool)
    got = await _scrape(create_app(_settings(tmp_path, team_labels=True)))
    assert got[("mayu_cluster_budget_utilisation_ratio", (
        ("figure", "committed"), ("id", team_id), ("scope", "team"), ("team", "alpha"),
        ("window", "day")))] == 0.5


async def test_scrapes_within_the_ttl_share_one_read(
        tmp_path: Path, pg_dsn: str, pg_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scrapes less than ttl_s apart read the database once; the series cap exports the
    most used budgets and counts the ones it left out."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    await _figures(pg_pool)
    app = create_app(_settings(tmp_path, team_labels=False))
    async with AsyncTestClient(app=app) as client:
        for _ in range(5):
            assert (await client.get("/metrics")).status_code == 200
        view = app.state.gateway.metrics.cluster
        assert view.reads == 1
        view._max, view._tried_at = 1, 0.0
        got = _samples((await client.get("/metrics")).text)
    assert view.reads == 2
    assert got[("mayu_cluster_budgets_omitted", ())] == 3  # alpha month, key day, beta day
    exported = {k[1] for k in got if k[0] == "mayu_cluster_budget_limit_micro_usd"}
    assert [dict(labels)["window"] for labels in exported] == ["day"]  # alpha day: 60 %
