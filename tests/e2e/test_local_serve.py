"""``mayu serve`` with no configuration: the offline demo a newcomer gets."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e._procs import Proc, free_port, start, wait_ready

pytestmark = pytest.mark.e2e


def _serve_default(workdir: Path) -> Proc:
    port = free_port()
    # No --config: the built-in local profile (data in ./.mayu, mock models).
    return wait_ready(start(["serve", "--port", str(port)], port=port,
                            log_path=workdir / f"serve-{port}.log"))


def test_first_run_prints_a_working_demo_key_once(tmp_path: Path) -> None:
    """First run prints the demo key and a curl line; the key works; a restart prints none."""
    first = _serve_default(tmp_path)
    try:
        log = first.logs()
        found = re.findall(r"sk-inf-[A-Za-z0-9_-]+", log)
        assert found and "curl -s" in log
        client = openai.OpenAI(base_url=f"{first.url}/v1", api_key=found[0], max_retries=0)
        reply = client.chat.completions.create(
            model="mock-gpt", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert reply.usage is not None and reply.usage.completion_tokens <= 8
    finally:
        first.stop()
    assert (tmp_path / ".mayu" / "mayu.db").exists()
    second = _serve_default(tmp_path)
    try:
        assert "sk-inf-" not in second.logs()
        assert httpx.get(f"{second.url}/healthz").status_code == 200
    finally:
        second.stop()
