"""The generation routes served below Litestar (``gateway.ingress._asgi``), through the
real openai and anthropic SDKs: answers, streams, refusals, bad bodies, and the wire
format (header names and order, as Litestar's responses had them)."""

from __future__ import annotations

import socket

import anthropic
import httpx
import openai
import pytest

from tests.e2e._procs import recv_head
from tests.e2e.conftest import MAX_BODY, Stack, expected_cost

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    return stack.team_key("fast", "--rpm", "100000", "--tpm", "100000000")


def _events(stack: Stack, request_id: str) -> list[str | None]:
    return [line.get("event") for line in stack.audit()
            if line.get("request_id") == request_id]


def test_openai_answer_headers_audit_and_cost(stack: Stack, oai: openai.OpenAI) -> None:
    """A chat completion: request id, permit, rate-limit and cost headers; its three audit
    lines; the cost equals the upstream ledger's price."""
    stack.clear_ledger()
    raw = oai.chat.completions.with_raw_response.create(
        model="gpt-up", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().choices[0].message.content
    (entry,) = stack.ledger()
    h = raw.headers
    assert int(h["x-inferplane-cost-micro-usd"]) == expected_cost(entry)
    assert h["x-inferplane-permit"] and h["x-ratelimit-remaining-requests"]
    assert h["content-type"] == "application/json"
    assert _events(stack, h["x-inferplane-request-id"]) == ["admitted", "dispatch", "settled"]


def test_anthropic_answer_and_stream(stack: Stack, claude: anthropic.Anthropic) -> None:
    """Messages, plain and streamed, through the Anthropic SDK; each settled and audited."""
    raw = claude.messages.with_raw_response.create(
        model="claude-up", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().usage.output_tokens > 0
    assert _events(stack, raw.headers["x-inferplane-request-id"])[-1] == "settled"
    with claude.messages.stream(model="claude-up", max_tokens=12,
                                messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.startswith("w0") and final.stop_reason


def test_openai_stream(stack: Stack, oai: openai.OpenAI) -> None:
    """A streamed chat completion arrives whole, with its usage when asked for."""
    chunks = list(oai.chat.completions.create(
        model="gpt-up", max_tokens=10, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hello"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_refusals_in_each_protocol(stack: Stack) -> None:
    """A rate refusal is the SDK's RateLimitError, with the protocol's headers and body."""
    key = stack.team_key("fast-refused", "--rpm", "1")
    oa = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key, max_retries=0)
    oa.chat.completions.create(model="gpt-up", max_tokens=5,
                               messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.RateLimitError) as oerr:
        oa.chat.completions.create(model="gpt-up", max_tokens=5,
                                   messages=[{"role": "user", "content": "hi"}])
    assert oerr.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(oerr.value.response.headers["retry-after"]) >= 1
    body = oerr.value.response.json()
    assert body["error"]["type"] == "rate_limit_error"
    rid = oerr.value.response.headers["x-inferplane-request-id"]
    assert _events(stack, rid) == ["refused"]
    an = anthropic.Anthropic(base_url=stack.gateway.url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as aerr:
        an.messages.create(model="claude-up", max_tokens=5,
                           messages=[{"role": "user", "content": "hi"}])
    assert aerr.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert aerr.value.response.json()["type"] == "error"


def test_unknown_key_is_401_in_each_protocol(stack: Stack) -> None:
    """An unknown key: the SDKs' AuthenticationError, nothing sent upstream."""
    stack.clear_ledger()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key="sk-nope",
                      max_retries=0).chat.completions.create(
            model="gpt-up", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=stack.gateway.url, api_key="sk-nope",
                            max_retries=0).messages.create(
            model="claude-up", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert stack.ledger() == []


def test_malformed_json_is_400_in_each_protocol(stack: Stack, key: str) -> None:
    """Malformed JSON: 400 in the caller's shape, one audit line, nothing upstream."""
    stack.clear_ledger()
    auth = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    r = httpx.post(f"{stack.gateway.url}/v1/chat/completions", content=b"{bad", headers=auth)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert _events(stack, r.headers["x-inferplane-request-id"]) == [None]
    r = httpx.post(f"{stack.gateway.url}/v1/messages", content=b"[1,", headers=auth)
    assert r.status_code == 400
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert stack.ledger() == []


def test_bad_fields_are_the_sdks_bad_request(oai: openai.OpenAI,
                                             claude: anthropic.Anthropic) -> None:
    """A refused field (negative max_tokens) is the SDK's BadRequestError."""
    with pytest.raises(openai.BadRequestError) as oerr:
        oai.chat.completions.create(model="gpt-up", max_tokens=-1,
                                    messages=[{"role": "user", "content": "hi"}])
    assert oerr.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="claude-up", max_tokens=-1,
                               messages=[{"role": "user", "content": "hi"}])


def test_huge_body_is_413_in_each_protocol(stack: Stack, oai: openai.OpenAI,
                                           claude: anthropic.Anthropic) -> None:
    """A body above server.max_body_bytes: 413 in the caller's shape, nothing upstream."""
    stack.clear_ledger()
    huge = "x" * (MAX_BODY + 1024)
    with pytest.raises(openai.APIStatusError) as oerr:
        oai.chat.completions.create(model="gpt-up", max_tokens=5,
                                    messages=[{"role": "user", "content": huge}])
    assert oerr.value.status_code == 413
    assert "max_body_bytes" in oerr.value.response.json()["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as aerr:
        claude.messages.create(model="claude-up", max_tokens=5,
                               messages=[{"role": "user", "content": huge}])
    assert aerr.value.status_code == 413
    assert aerr.value.response.json()["type"] == "error"
    assert stack.ledger() == []


def test_other_methods_and_spellings_still_go_through_litestar(stack: Stack,
                                                               key: str) -> None:
    """GET on a generation route is 405; a trailing slash is the same route."""
    auth = {"Authorization": f"Bearer {key}"}
    r = httpx.get(f"{stack.gateway.url}/v1/chat/completions", headers=auth)
    assert r.status_code == 405 and r.json()["error"]["type"]
    r = httpx.post(f"{stack.gateway.url}/v1/chat/completions/", headers=auth,
                   json={"model": "gpt-up", "max_tokens": 5,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.headers["x-inferplane-permit"]


def _raw_head(stack: Stack, request: bytes) -> list[bytes]:
    with socket.create_connection(("127.0.0.1", stack.gateway.port), timeout=10) as s:
        s.sendall(request)
        data = recv_head(s)
    head = data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    return [head[0]] + [line.split(b":", 1)[0] for line in head[1:]]


def _post(path: str, body: bytes, key: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {key}\r\ncontent-length: {len(body)}\r\n\r\n"
            ).encode() + body


def test_wire_heads_are_what_litestar_sent(stack: Stack, key: str) -> None:
    """Status lines and header names, in order, as Litestar's responses had them."""
    ok = b'{"model":"gpt-up","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'
    assert _raw_head(stack, _post("/v1/chat/completions", ok, key)) == [
        b"HTTP/1.1 200 OK", b"date", b"server", b"x-inferplane-request-id",
        b"x-inferplane-token-bound", b"x-inferplane-usd-bound", b"x-inferplane-permit",
        b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests",
        b"x-ratelimit-reset-requests", b"x-ratelimit-limit-tokens",
        b"x-ratelimit-remaining-tokens", b"x-ratelimit-reset-tokens",
        b"x-inferplane-cost-micro-usd", b"x-inferplane-committed-micro-usd",
        b"x-inferplane-liability-micro-usd", b"content-type", b"content-length"]
    streamed = ok[:-1] + b',"stream":true}'
    assert _raw_head(stack, _post("/v1/chat/completions", streamed, key))[-4:] == [
        b"cache-control", b"x-accel-buffering", b"content-type", b"transfer-encoding"]
    assert _raw_head(stack, _post("/v1/chat/completions", b"{bad", key)) == [
        b"HTTP/1.1 400 Bad Request", b"date", b"server", b"x-inferplane-request-id",
        b"content-type", b"content-length"]
