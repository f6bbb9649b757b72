"""The ``admin`` fixture: a client of a fresh gateway through the real app factory, on both
profiles (local: SQLite; shared: a migrated Postgres), with a write token
(``terraform``) and a read token (``portal``); settings from
:func:`tests.integration._admin.gateway_settings`. The ``clock`` fixture: a settable
clock at :data:`tests.integration._local.T0` for the local stores.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from tests.integration._admin import gateway_settings
from tests.integration._local import Clock


@pytest.fixture
def clock() -> Clock:
    """A settable clock at T0, handed to the local stores a test opens."""
    return Clock()


@pytest.fixture(params=["local", "shared"])
async def admin(request: pytest.FixtureRequest, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch
                ) -> AsyncIterator[tuple[AsyncTestClient[Any], Path]]:
    """A client of a fresh gateway with the two admin tokens, and its audit file."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=request.param)
    async with AsyncTestClient(app=create_app(settings)) as client:
        yield client, tmp_path / "audit.jsonl"
