"""Standalone mode's warning (ADR-031), as a real ``mayu serve``: a local-profile gateway
with no control plane and no OIDC issuer says once at startup, and in ``/readyz``'s
detail, that it is not recommended for production, and its demo key keeps working.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
import yaml

from gateway.standalone import WARNING
from tests.e2e._procs import Proc, start_gateway

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """``mayu serve`` on the local profile with its demo team, two workers."""
    work = tmp_path_factory.mktemp("standalone")
    config = work / "mayu.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(work / "data"),
                                      "server": {"workers": 2}}))
    proc = start_gateway(config)
    yield proc
    proc.stop()


def test_standalone_says_once_at_startup_and_in_readyz(demo: Proc) -> None:
    """Two workers, one WARNING line naming the mode as not for production; /readyz is
    200 with the same words as its detail."""
    ready = httpx.get(f"{demo.url}/readyz", timeout=10)
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "detail": WARNING}
    lines = [x for x in demo.logs().splitlines() if WARNING in x]
    assert len(lines) == 1 and " WARNING mayu" in lines[0], demo.logs()
    assert "not recommended for production" in WARNING


def test_the_demo_key_keeps_working_in_standalone_mode(demo: Proc) -> None:
    """The demo key printed at startup is answered, not refused, by a standalone gateway."""
    key = re.search(r"^\s+(sk-inf-\S+)$", demo.logs(), re.MULTILINE)
    assert key, demo.logs()
    r = httpx.post(f"{demo.url}/v1/chat/completions", timeout=30,
                   headers={"Authorization": f"Bearer {key.group(1)}"},
                   json={"model": "mock-gpt", "max_tokens": 16,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
