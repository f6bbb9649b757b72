"""Bad input gets a clear error in the ingress's own shape and loses nothing recorded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e._procs import run_cli
from tests.e2e.conftest import MAX_BODY, MAX_OUTPUT, Stack

pytestmark = pytest.mark.e2e

OPENAI_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    key = stack.team_key("bad-input", "--usd-micros-per-day", "50000000")
    # Something committed first, so "changes nothing" is checked against non-zero figures.
    r = httpx.post(f"{stack.gateway.url}/v1/chat/completions", json={
        "model": "gpt-up", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    return key


@pytest.fixture
def unchanged(stack: Stack, key: str) -> Iterator[None]:
    """The test's requests must leave /v1/usage exactly as it was."""
    before = stack.usage(key)
    assert before
    yield
    assert stack.usage(key) == before


def _openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) == OPENAI_KEYS
    return err


def _anthropic_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    # "details" carries the refusal's machine-readable error_code where there is one.
    assert body["type"] == "error" and set(body["error"]) <= {"type", "message", "details"}
    err: dict[str, Any] = body["error"]
    return err


def _post(stack: Stack, key: str, path: str, content: bytes) -> httpx.Response:
    return httpx.post(f"{stack.gateway.url}{path}", content=content, timeout=30,
                      headers={"Authorization": f"Bearer {key}",
                               "content-type": "application/json"})


def test_malformed_json_is_400_in_each_shape(stack: Stack, key: str, unchanged: None) -> None:
    """Malformed JSON: 400, OpenAI shape on OpenAI routes, Anthropic shape on /v1/messages."""
    r = _post(stack, key, "/v1/chat/completions", b'{"model": ')
    err = _openai_error(r, 400)
    assert "not valid JSON" in err["message"]
    [line] = [a for a in stack.audit()
              if a.get("request_id") == r.headers["x-inferplane-request-id"]]
    assert line["status"] == 400 and line["error"] == "invalid_request" and line["key_id"]
    err = _anthropic_error(_post(stack, key, "/v1/messages", b"{nope"), 400)
    assert err["type"] == "invalid_request_error" and "not valid JSON" in err["message"]


def test_oversized_body_is_413(stack: Stack, key: str, unchanged: None) -> None:
    """A body over server.max_body_bytes is refused with 413, naming the setting."""
    big = b'{"model": "gpt-up", "messages": [{"role": "user", "content": "' + \
        b"x" * MAX_BODY + b'"}]}'
    err = _openai_error(_post(stack, key, "/v1/chat/completions", big), 413)
    assert "server.max_body_bytes" in err["message"]
    err = _anthropic_error(_post(stack, key, "/v1/messages", big), 413)
    assert err["type"] == "request_too_large"


@pytest.mark.parametrize("max_tokens", [MAX_OUTPUT + 1, 10**15, -1, 2.5, "many"])
def test_absurd_or_negative_max_tokens_is_400(stack: Stack, key: str, unchanged: None,
                                              max_tokens: object) -> None:
    """max_tokens negative, non-integer or above server.max_output_tokens: 400 naming it."""
    body = httpx.Request("POST", "/", json={
        "model": "gpt-up", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}]}).content
    err = _openai_error(_post(stack, key, "/v1/chat/completions", body), 400)
    assert err["param"] == "max_tokens" and "max_tokens" in err["message"]


def test_unknown_model_is_404(stack: Stack, key: str, unchanged: None) -> None:
    """An unconfigured model: 404 model_not_found (Anthropic: not_found_error)."""
    body = b'{"model": "no-such-model", "max_tokens": 5, "messages": []}'
    assert _openai_error(_post(stack, key, "/v1/chat/completions", body),
                         404)["code"] == "model_not_found"
    assert _anthropic_error(_post(stack, key, "/v1/messages", body),
                            404)["type"] == "not_found_error"


def test_unknown_key_is_401(stack: Stack, unchanged: None) -> None:
    """An unknown key is refused with 401 before anything else."""
    r = _post(stack, "sk-inf-not-a-key", "/v1/chat/completions", b"{}")
    assert _openai_error(r, 401)["code"] == "invalid_api_key"


def test_upstream_500_passes_through_and_charges_nothing(stack: Stack, key: str) -> None:
    """An upstream error keeps its status and body; no money or tokens are committed."""
    before = stack.team_usage(key)
    r = _post(stack, key, "/v1/chat/completions",
              b'{"model": "gpt-500", "max_tokens": 5, "messages": []}')
    assert _openai_error(r, 500)["code"] == "mock_error"
    assert r.headers["retry-after"] == "1"  # the upstream's own header is relayed
    after = stack.team_usage(key)
    assert (after["usd_committed"], after["usd_reserved"]) == (before["usd_committed"], 0)


def test_missing_upstream_usage_keeps_the_bound(stack: Stack, key: str) -> None:
    """Usage missing from the upstream: the answer is relayed, nothing unobserved is
    committed, and the whole bound becomes liability (it keeps binding the limits)."""
    before = stack.team_usage(key)
    r = _post(stack, key, "/v1/chat/completions",
              b'{"model": "gpt-missing", "max_tokens": 5, "messages": []}')
    assert r.status_code == 200 and "usage" not in r.json()
    assert "x-inferplane-cost-micro-usd" not in r.headers
    after = stack.team_usage(key)
    assert after["usd_committed"] == before["usd_committed"]
    assert after["usd_liability"] - before["usd_liability"] == int(
        r.headers["x-inferplane-usd-bound"]) == int(r.headers["x-inferplane-liability-micro-usd"])
    assert after["tokens_liability"] - before["tokens_liability"] == int(
        r.headers["x-inferplane-token-bound"])
    assert after["usd_reserved"] == 0


def test_negative_upstream_usage_is_502_commits_nothing_and_freezes(stack: Stack) -> None:
    """Negative usage: 502 in the ingress's shape, nothing committed, the account frozen."""
    for model, path, shape in (("gpt-neg", "/v1/chat/completions", _openai_error),
                               ("claude-neg", "/v1/messages", _anthropic_error)):
        key = stack.team_key(f"negative-{model}", "--usd-micros-per-day", "50000000")
        body = (f'{{"model": "{model}", "max_tokens": 5, "messages": '
                '[{"role": "user", "content": "hi"}]}').encode()
        before = stack.team_usage(key)
        err = shape(_post(stack, key, path, body), 502)
        assert "invalid usage" in err["message"]
        after = stack.team_usage(key)
        assert after["usd_committed"] == before["usd_committed"] == 0
        assert after["tokens_committed"] == before["tokens_committed"] == 0
        frozen = shape(_post(stack, key, path, body.replace(b"-neg", b"-up")), 402)
        assert "frozen" in frozen["message"]


def test_broken_config_exits_non_zero_naming_the_key(tmp_path: Path) -> None:
    """mayu serve --config bad.yaml exits non-zero and names the bad key path."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  port: not-a-port\n")
    done = run_cli("serve", "--config", str(bad))
    assert done.returncode != 0
    assert "server.port" in done.stderr
    bad.write_text("providers:\n  - {name: x, kind: openai}\nmodels: []\n")
    done = run_cli("serve", "--config", str(bad))
    assert done.returncode != 0 and "providers[0].base_url" in done.stderr
    bad.write_text(f"data_dir: {tmp_path / 'data'}\n"
                   "server:\n  admin_token_ref: env:MAYU_E2E_SURELY_UNSET\n")
    done = run_cli("serve", "--config", str(bad), "--port", "0")
    assert done.returncode != 0
    # Caught by serve's preflight, before uvicorn starts: one line naming the key.
    assert "server.admin_token_ref" in done.stdout + done.stderr
    assert "MAYU_E2E_SURELY_UNSET" in done.stdout + done.stderr
