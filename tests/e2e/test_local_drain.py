"""``server.drain_on_disconnect_s``: after a client leaves mid-stream, the gateway reads the
upstream on (discarded) so the usage arrives and the permit settles exactly."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e._procs import create_key, create_team, start_gateway, start_mock_upstream
from tests.e2e.conftest import ADMIN_TOKEN, expected_cost, gateway_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def draining(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, str, Path, str]]:
    """(gateway URL, mock upstream URL, data dir, key) of a gateway with drain 10 s."""
    workdir = tmp_path_factory.mktemp("drain")
    upstream = start_mock_upstream(workdir)
    config = gateway_config(workdir, upstream)
    doc = yaml.safe_load(config.read_text())
    doc["server"]["drain_on_disconnect_s"] = 10
    config.write_text(yaml.safe_dump(doc))
    gateway = start_gateway(config, env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN})
    create_team(config, "drain", "--usd-micros-per-day", "100000000")
    key = create_key(config, "drain")
    try:
        yield gateway.url, upstream.url, workdir / "data", key
    finally:
        gateway.stop()
        upstream.stop()


def _settled(data: Path, permit: str) -> dict[str, Any]:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        for path in data.glob("audit-*.jsonl"):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("permit") == permit and rec.get("event") == "settled":
                    return rec
        time.sleep(0.1)
    raise AssertionError(f"permit {permit} never settled")


def test_disconnect_with_drain_settles_exactly(draining: Any) -> None:
    """The client leaves after three events; the gateway keeps reading the upstream, the
    usage arrives and the permit settles complete at the upstream's own figure."""
    url, upstream, data, key = draining
    httpx.delete(f"{upstream}/__mock/ledger").raise_for_status()
    body = {"model": "claude-slow", "max_tokens": 40, "stream": True,
            "messages": [{"role": "user", "content": "a long story please"}]}
    seen = 0
    with httpx.Client(base_url=url, timeout=60) as client, client.stream(
            "POST", "/v1/messages", json=body,
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"}) as r:
        permit = r.headers["x-inferplane-permit"]
        for chunk in r.iter_bytes():
            seen += chunk.count(b"\n\n")
            if seen >= 3:
                break
    line = _settled(data, permit)
    assert line["outcome"] == "complete" and line["usd_liability"] == 0, line
    [entry] = httpx.get(f"{upstream}/__mock/ledger").json()
    assert line["usd_committed"] == expected_cost(entry)
