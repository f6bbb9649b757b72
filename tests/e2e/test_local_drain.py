"""``server.drain_on_disconnect_s``: after a client leaves mid-stream, the gateway reads the
upstream on (discarded) so the usage arrives and the permit settles exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e._procs import Proc, create_key, create_team, serving, settled_line
from tests.e2e.conftest import ADMIN_TOKEN, expected_cost, gateway_doc

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def draining(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, str, Path, str]]:
    """(gateway URL, mock upstream URL, data dir, key) of a gateway with drain 10 s."""
    workdir = tmp_path_factory.mktemp("drain")

    def doc(upstream: Proc) -> dict[str, Any]:
        config = gateway_doc(workdir, upstream)
        config["server"]["drain_on_disconnect_s"] = 10
        return config
    with serving(workdir, doc, env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN}) as (
            gateway, upstream, config):
        create_team(config, "drain", "--usd-micros-per-day", "100000000")
        yield gateway.url, upstream.url, workdir / "data", create_key(config, "drain")



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
    line = settled_line(data, permit=permit)
    assert line["outcome"] == "complete" and line["usd_liability"] == 0, line
    [entry] = httpx.get(f"{upstream}/__mock/ledger").json()
    assert line["usd_committed"] == expected_cost(entry)
