"""The agents' usage reports are kept as long as the request log (``retention_days``):
past N days and never in the current UTC month, on both profiles (local SQLite, shared
Postgres), through the app's own report store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from gateway.app import create_app
from gateway.otlp_import import ReportStore, report_cutoff
from tests.integration._admin import gateway_settings
from tests.integration._inapp import in_app

pytestmark = pytest.mark.integration

LOGS = (Path(__file__).parent / "data" / "claude_code_export_logs.pb").read_bytes()
WRITE = "w" * 8 + "-agent-retention-token"
NOW = datetime(2026, 12, 7, 12, tzinfo=UTC)


def test_the_cutoff_is_n_days_ago_and_never_in_the_current_month() -> None:
    """30 days on 7 December: 7 November; 3 days: 1 December, not 4 December."""
    assert report_cutoff(30, NOW) == datetime(2026, 11, 7, 12, tzinfo=UTC)
    assert report_cutoff(3, NOW) == datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture(params=["local", "shared"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch
                  ) -> AsyncIterator[tuple[AsyncTestClient[Any], str]]:
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=request.param,
                                tokens={"ops": ("write", WRITE)})
    async with AsyncTestClient(app=create_app(settings)) as client:
        w = {"Authorization": f"Bearer {WRITE}"}
        assert (await client.post("/admin/v1/teams", json={"name": "t"}, headers=w)).is_success
        key = (await client.post("/admin/v1/keys", json={"team": "t"},
                                 headers=w)).json()["secret"]
        yield client, key


def _at(when: datetime, prompt: str) -> bytes:
    """The Claude Code export, its api_request event at ``when`` (another prompt id)."""
    export = ExportLogsServiceRequest()
    export.ParseFromString(LOGS)
    for record in export.resource_logs[0].scope_logs[0].log_records:
        for kv in record.attributes:
            if kv.key == "event.timestamp":
                kv.value.CopyFrom(AnyValue(string_value=when.isoformat()))
            elif kv.key == "prompt.id":
                kv.value.CopyFrom(AnyValue(string_value=prompt))
    return export.SerializeToString()


async def test_pruning_drops_the_reports_past_the_cutoff_only(
        gateway: tuple[AsyncTestClient[Any], str]) -> None:
    """Reports of October and of 5 December; pruned with 3 days on 7 December: October's
    go, December's stay (its month is open)."""
    client, key = gateway
    for when, prompt in ((datetime(2026, 10, 3, tzinfo=UTC), "old"),
                         (datetime(2026, 12, 5, tzinfo=UTC), "open-month")):
        r = await client.post("/v1/logs", content=_at(when, prompt), headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"})
        assert r.status_code == 200, r.content

    async def days() -> list[str]:
        r = await client.get("/admin/v1/agent-usage", params={"group_by": "team"},
                             headers={"Authorization": f"Bearer {WRITE}"})
        return sorted(row["period"] for row in r.json()["data"] if row["reported"]["reports"])

    assert await days() == ["2026-10-03", "2026-12-05"]
    store: ReportStore = client.app.state.agent_usage
    assert in_app(client, store.prune, before=report_cutoff(3, NOW)) == 1
    assert await days() == ["2026-12-05"]
    assert in_app(client, store.prune, before=report_cutoff(3, NOW + timedelta(days=30))) == 1
    assert await days() == []
