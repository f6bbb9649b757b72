"""The OTLP receiver for agents' own usage (``POST /v1/logs``, ``/v1/metrics``) on the real
app factory, both profiles (local SQLite, shared Postgres): what is stored, once, for
whom; what is refused and in which shape; and that nothing billed moves.

The exports replayed here are Claude Code 2.1.197's own, captured from ``claude -p``
against ``mayu mock-upstream`` (``data/claude_code_export_{logs,metrics}.pb``: one
``claude_code.api_request`` event, and the session's token and cost counters).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from litestar.testing import AsyncTestClient
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gateway.app import create_app
from gateway.otlp_import import MAX_EXPORT_BYTES, decode_logs
from tests.integration._admin import gateway_settings

pytestmark = pytest.mark.integration

DATA = Path(__file__).parent / "data"
LOGS = (DATA / "claude_code_export_logs.pb").read_bytes()
METRICS = (DATA / "claude_code_export_metrics.pb").read_bytes()
WRITE = "w" * 8 + "-agent-usage-token"
PB = {"Content-Type": "application/x-protobuf"}
# What Claude Code reported for its one request (the mock upstream's figures).
REPORTED = {"input_tokens": 15248, "output_tokens": 28, "cache_read_tokens": 725,
            "cache_write_tokens": 727, "reported_cost_uusd": 81846}


@pytest.fixture(params=["local", "shared"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch
                  ) -> AsyncIterator[tuple[AsyncTestClient[Any], str, str]]:
    """A fresh gateway, a team ``t`` and two keys of it: (client, key, other key)."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=request.param,
                                tokens={"ops": ("write", WRITE)})
    async with AsyncTestClient(app=create_app(settings)) as client:
        w = {"Authorization": f"Bearer {WRITE}"}
        assert (await client.post("/admin/v1/teams", json={"name": "t"}, headers=w)).is_success
        keys = [(await client.post("/admin/v1/keys", json={"team": "t", "user": u},
                                   headers=w)).json()["secret"] for u in ("ana", "bo")]
        yield client, keys[0], keys[1]


def _auth(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **PB, **extra}


def _status(body: bytes) -> tuple[int, str]:
    """A google.rpc.Status's code (field 1, varint) and message (field 2)."""
    code, message, i = 0, "", 0
    while i < len(body):
        tag = body[i]
        i += 1
        value = shift = 0
        while True:
            byte = body[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if tag == 0x08:
            code = value
        elif tag == 0x12:
            message, i = body[i:i + value].decode(), i + value
    return code, message


async def _agent_usage(client: AsyncTestClient[Any], **params: str) -> dict[str, Any]:
    r = await client.get("/admin/v1/agent-usage", params=params,
                         headers={"Authorization": f"Bearer {WRITE}"})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _reported(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [row["reported"] for row in body["data"] if row["reported"]["reports"]]


def _audit(client: AsyncTestClient[Any]) -> list[dict[str, Any]]:
    path = Path(client.app.state.gateway.audit.path)
    return [json.loads(line) for line in path.read_text().splitlines()
            if '"agent_usage_import"' in line]


async def test_a_replayed_export_is_stored_once(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """The same Claude Code export posted twice (and once more as OTLP/JSON) is stored
    once, for the key's team and user, with the figures Claude Code reported."""
    client, key, _ = gateway
    for _ in range(2):
        r = await client.post("/v1/logs", content=LOGS, headers=_auth(key))
        assert r.status_code == 200, r.content
        assert r.headers["content-type"].startswith("application/x-protobuf")
        answer = ExportLogsServiceResponse()
        answer.ParseFromString(r.content)
        assert answer.partial_success.rejected_log_records == 0
    as_json = json_format.MessageToJson(_parsed(LOGS)).encode()
    r = await client.post("/v1/logs", content=as_json,
                          headers={**_auth(key), "Content-Type": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = await _agent_usage(client)
    (row,) = [row for row in body["data"] if row["reported"]["reports"]]
    assert row["team_id"] is not None and row["user"] == "ana"
    assert row["reported"] == {"reports": 1, "tokens": 16728, **REPORTED}
    (session,) = body["sessions"]
    assert session["agent"] == "claude-code" and session["session_id"]
    assert [a["stored"] for a in _audit(client)] == [1, 0, 0]


def _parsed(body: bytes) -> ExportLogsServiceRequest:
    export = ExportLogsServiceRequest()
    export.ParseFromString(body)
    return export


async def test_a_wrong_key_is_a_401_and_stores_nothing(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """No key, an unknown key: 401 as a google.rpc.Status (UNAUTHENTICATED), nothing
    stored."""
    client, _, _ = gateway
    for headers in (PB, _auth("sk-not-a-key-of-this-gateway")):
        r = await client.post("/v1/logs", content=LOGS, headers=headers)
        assert r.status_code == 401, r.content
        code, message = _status(r.content)
        assert code == 16 and message, r.content
    r = await client.post("/v1/metrics", content=METRICS,
                          headers={"x-api-key": "sk-unknown", **PB})
    assert r.status_code == 401
    body = await _agent_usage(client)
    assert _reported(body) == [] and body["sessions"] == []


async def test_a_body_that_is_no_export_is_a_400_in_otlp_shape(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """Garbage protobuf, broken OTLP/JSON: 400 INVALID_ARGUMENT in the request's own
    encoding; another content type: 415; never a 500, nothing stored."""
    client, key, _ = gateway
    r = await client.post("/v1/logs", content=b"\xff\xff\xff\xff garbage", headers=_auth(key))
    assert r.status_code == 400, r.content
    code, message = _status(r.content)
    assert code == 3 and "ExportLogsServiceRequest" in message
    r = await client.post("/v1/metrics", content=b'{"resourceMetrics": [{"resource": 7}]}',
                          headers={**_auth(key), "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == 3, r.content
    r = await client.post("/v1/logs", content=LOGS,
                          headers={**_auth(key), "Content-Type": "text/plain"})
    assert r.status_code == 415, r.content
    assert _reported(await _agent_usage(client)) == []


async def test_a_huge_export_is_a_413(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """Over MAX_EXPORT_BYTES as sent, or once gzip-inflated: 413, nothing stored."""
    client, key, _ = gateway
    r = await client.post("/v1/logs", content=b"\0" * (MAX_EXPORT_BYTES + 1),
                          headers=_auth(key))
    assert r.status_code == 413 and _status(r.content)[0] == 8, r.content
    bomb = gzip.compress(b"\0" * (MAX_EXPORT_BYTES * 2))
    r = await client.post("/v1/logs", content=bomb,
                          headers=_auth(key, **{"Content-Encoding": "gzip"}))
    assert r.status_code == 413, r.content
    r = await client.post("/v1/logs", content=gzip.compress(LOGS),
                          headers=_auth(key, **{"Content-Encoding": "gzip"}))
    assert r.status_code == 200, r.content
    assert [row["reported"]["reports"] for row in (await _agent_usage(client))["data"]] == [1]


def _with_count(export: ExportLogsServiceRequest, name: str, value: int) -> bytes:
    """``export`` plus a copy of its api_request record whose ``name`` is ``value``
    (another prompt id: another event)."""
    logs = export.resource_logs[0].scope_logs[0]
    (record,) = [r for r in logs.log_records if r.body.string_value == "claude_code.api_request"]
    copy = logs.log_records.add()
    copy.CopyFrom(record)
    for kv in copy.attributes:
        if kv.key == name:
            kv.value.CopyFrom(AnyValue(int_value=value))
        elif kv.key == "prompt.id":
            kv.value.CopyFrom(AnyValue(string_value=f"{name}={value}"))
    return export.SerializeToString()


async def test_negative_counts_are_refused_never_stored(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """A record with a negative token count is refused (not clamped: that would be a
    figure the agent never sent), counted in partial_success; the valid records of the
    same export are stored."""
    client, key, _ = gateway
    body = _with_count(_parsed(LOGS), "output_tokens", -5)
    assert decode_logs(body, "protobuf").refused == 1
    r = await client.post("/v1/logs", content=body, headers=_auth(key))
    assert r.status_code == 200, r.content
    answer = ExportLogsServiceResponse()
    answer.ParseFromString(r.content)
    assert answer.partial_success.rejected_log_records == 1
    assert "negative" in answer.partial_success.error_message
    (reported,) = _reported(await _agent_usage(client))
    assert reported["reports"] == 1 and reported["output_tokens"] == 28


async def test_metrics_count_only_for_a_session_without_events(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """Claude Code's token and cost counters are stored (once), and summed for a session
    only when none of its log events arrived: both report the same request."""
    client, key, other = gateway
    for _ in range(2):
        r = await client.post("/v1/metrics", content=METRICS, headers=_auth(other))
        assert r.status_code == 200, r.content
    (reported,) = _reported(await _agent_usage(client))
    assert reported == {"reports": 1, "tokens": 16728, **REPORTED}
    # The same session's event, for the same key: the event counts, not both.
    assert (await client.post("/v1/logs", content=LOGS, headers=_auth(other))).is_success
    (reported,) = _reported(await _agent_usage(client))
    assert reported == {"reports": 1, "tokens": 16728, **REPORTED}


async def test_the_import_moves_no_billed_figure(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """Committed, liability and reserved (``/v1/usage`` and the request log) are the same
    before and after an import; the usage API sets both sides and the gap per key."""
    client, key, other = gateway
    r = await client.post("/v1/messages", headers={"x-api-key": key},
                          json={"model": "mock-claude", "max_tokens": 16,
                                "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text

    async def billed() -> tuple[Any, Any]:
        usage = (await client.get("/v1/usage", headers={"x-api-key": key})).json()
        summary = (await client.get("/admin/v1/requests/summary",
                                    headers={"Authorization": f"Bearer {WRITE}"})).json()
        return usage, summary

    before = await billed()
    for export, path in ((LOGS, "/v1/logs"), (METRICS, "/v1/metrics")):
        assert (await client.post(path, content=export, headers=_auth(key))).is_success
    assert await billed() == before
    # Over all time: the recorded export's events carry the day it was recorded on, the
    # request the day the test runs (per-day rows would split them on any other day).
    body = await _agent_usage(client, group_by="key", bucket="none")
    (row,) = body["data"]
    gw = row["gateway"]
    assert gw["requests"] == 1 and gw["tokens_committed"] > 0 and gw["usd_committed"] > 0
    assert row["reported"]["tokens"] == 16728
    assert row["gap_tokens"] == 16728 - gw["tokens_committed"]
    assert row["gap_uusd"] == REPORTED["reported_cost_uusd"] - gw["usd_committed"]
    assert row["bypass_suspected"] is True  # 16 k reported, a few dozen seen
    # A key sees its own side by side, never another key's reports.
    mine = (await client.get("/v1/me/agent-usage", headers={"x-api-key": other})).json()
    assert _reported(mine) == [] and mine["sessions"] == []


async def test_codex_usage_events_are_read_as_uncached_input_and_cache_reads(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """A Codex ``codex.sse_event`` of kind response.completed: its input count includes
    the cached tokens (OpenAI's way), stored as uncached input plus cache reads."""
    client, key, _ = gateway
    export = ExportLogsServiceRequest()
    resource = export.resource_logs.add()
    resource.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value="codex_exec")))
    record = resource.scope_logs.add().log_records.add()
    record.time_unix_nano = 1_796_665_143_000_000_000
    for k, v in (("event.name", AnyValue(string_value="codex.sse_event")),
                 ("event.kind", AnyValue(string_value="response.completed")),
                 ("conversation.id", AnyValue(string_value="c-1")),
                 ("model", AnyValue(string_value="gpt-5-codex")),
                 ("input_token_count", AnyValue(int_value=1200)),
                 ("cached_token_count", AnyValue(int_value=1000)),
                 ("output_token_count", AnyValue(int_value=30))):
        record.attributes.append(KeyValue(key=k, value=v))
    r = await client.post("/v1/logs", content=export.SerializeToString(), headers=_auth(key))
    assert r.status_code == 200, r.content
    body = await _agent_usage(client)
    (reported,) = _reported(body)
    assert reported == {"reports": 1, "input_tokens": 200, "cache_read_tokens": 1000,
                        "output_tokens": 30, "cache_write_tokens": 0, "tokens": 1230,
                        "reported_cost_uusd": None}
    (row,) = body["data"]
    assert row["gap_uusd"] is None  # Codex reports no cost
    assert [s["agent"] for s in body["sessions"]] == ["codex"]
