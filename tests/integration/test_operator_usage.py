"""An operator's exact usage, through both doors (``/admin/v1/permits/{id}/resolve`` and
``mayu permits resolve --usage``): one check, and no usage is taken for a $0 settlement.

The API runs on the real app factory (local SQLite and shared Postgres), with the mock's
cut stream leaving an uncertain permit to resolve; the CLI runs as a real subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.jsondepth import MAX_JSON_DEPTH
from tests.integration._admin import gateway_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WRITE = "w" * 8 + "-operator-write-token"
CUT = "mock-cut-stream"


@pytest.fixture(params=["local", "shared"])
async def client(request: pytest.FixtureRequest, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AsyncTestClient[Any]]:
    """A fresh gateway with a write token and the mock's cut-stream model."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=request.param,
                                tokens={"ops": ("write", WRITE)})
    settings = replace(settings, models=[*settings.models,
                                         replace(settings.models[0], name=CUT)])
    async with AsyncTestClient(app=create_app(settings)) as c:
        yield c


async def test_an_empty_usage_is_a_400_and_settles_nothing(
        client: AsyncTestClient[Any]) -> None:
    """An uncertain permit resolved with {"usage": {}} is a 400 naming usage, and keeps
    its liability; a usage naming one class (even 0) is an exact figure."""
    w = {"Authorization": f"Bearer {WRITE}"}
    assert (await client.post("/admin/v1/teams", json={"name": "t"}, headers=w)).is_success
    secret = (await client.post("/admin/v1/keys", json={"team": "t"},
                                headers=w)).json()["secret"]
    await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                      json={"model": CUT, "max_tokens": 16, "stream": True,
                            "messages": [{"role": "user", "content": "hello"}]})
    (row,) = (await client.get("/admin/v1/requests", headers=w)).json()["data"]
    assert row["status"] == "uncertain" and row["usd_liability"] > 0, row
    path = f"/admin/v1/permits/{row['permit_id']}/resolve"
    r = await client.post(path, json={"usage": {}}, headers=w)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "usage" and "at least one of input" in error["message"]
    (after,) = (await client.get("/admin/v1/requests", headers=w)).json()["data"]
    assert after["status"] == "uncertain"
    assert after["usd_liability"] == row["usd_liability"]
    r = await client.post(path, json={"usage": {"input": 3}}, headers=w)
    assert r.status_code == 200 and r.json()["status"] == "complete", r.text
    assert r.json()["usd_liability"] == 0


@pytest.mark.parametrize("usage", ["[" * 5000 + "]" * 5000,
                                   '{"input": ' + "[" * 5000 + "]" * 5000 + "}", "{}"])
def test_a_bad_cli_usage_is_one_line_and_exit_2(tmp_path: Path, usage: str) -> None:
    """--usage nested 5,000 deep (or empty) is one line on stderr naming --usage (the
    gateway's JSON depth limit), exit 2, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "permits", "resolve", "p-1", "--usage", usage],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "--usage" in done.stderr
    if usage != "{}":
        assert f"deeper than {MAX_JSON_DEPTH}" in done.stderr
