"""The app factory wires shared-mode settings into the stores it builds (real Postgres)."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config import DatabaseSettings, GovernanceStoreSettings, KeyStoreSettings, Settings


def _settings(tmp_path: Path, coalesce: int) -> Settings:
    return Settings(data_dir=str(tmp_path), demo=False,
                    key_store=KeyStoreSettings(type="postgres"),
                    governance_store=GovernanceStoreSettings(type="postgres"),
                    database=DatabaseSettings(pool_min_size=1, pool_max_size=2,
                                              admission_coalesce=coalesce,
                                              settlement_coalesce=coalesce))


@pytest.mark.parametrize("coalesce", [0, 3])
async def test_admission_coalesce_reaches_the_governance_store(
        tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch, coalesce: int) -> None:
    """database.admission_coalesce and settlement_coalesce: N gives a store coalescing at
    most N calls of each; 0 none."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    app = create_app(_settings(tmp_path, coalesce))
    async with AsyncTestClient(app=app):
        gov = app.state.gateway.governance
        for coalescer in (gov._coalescer, gov._settler):
            if coalesce == 0:
                assert coalescer is None
            else:
                assert coalescer is not None and coalescer._max_in_flight == coalesce
