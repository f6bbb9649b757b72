"""A client that disconnects mid-stream: what was observed commits, the rest of the bound
is liability (server.drain_on_disconnect_s = 0: the upstream request is aborted)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e


def _wait_settled(stack: Stack, key: str) -> dict[str, object]:
    """Poll /v1/usage until nothing is reserved (settlement follows the disconnect)."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        usage = stack.team_usage(key)
        if usage["requests"] and not usage["usd_reserved"]:
            return usage
        time.sleep(0.1)
    raise AssertionError(f"never settled: {stack.team_usage(key)}")


@pytest.mark.parametrize("model,path", [("gpt-slow", "/v1/chat/completions"),
                                        ("claude-slow", "/v1/messages")])
def test_disconnect_mid_stream_keeps_the_bound_as_liability(stack: Stack, model: str,
                                                            path: str) -> None:
    """Disconnecting after the first chunk settles uncertain: committed + liability is the
    whole bound, committed only what was observed."""
    key = stack.team_key(f"disconnect-{model}", "--usd-micros-per-day", "10000000")
    stack.clear_ledger()
    body = {"model": model, "max_tokens": 40, "stream": True,
            "messages": [{"role": "user", "content": "a long story please"}]}
    with httpx.Client(base_url=stack.gateway.url, timeout=60) as client, \
            client.stream("POST", path, json=body,
                          headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200
        token_bound = int(r.headers["x-inferplane-token-bound"])
        usd_bound = int(r.headers["x-inferplane-usd-bound"])
        permit = r.headers["x-inferplane-permit"]
        next(r.iter_bytes())
        # leaving the block closes the connection mid-stream
    usage = _wait_settled(stack, key)
    assert usage["usd_committed"] + usage["usd_liability"] == usd_bound
    assert usage["tokens_committed"] + usage["tokens_liability"] == token_bound
    assert usage["usd_committed"] < usd_bound
    audit = [a for a in stack.audit() if a.get("permit") == permit
             and a.get("event") == "settled"]
    assert [a["outcome"] for a in audit] == ["uncertain"]
    assert stack.ledger() == []  # the upstream never got to report usage


def test_disconnect_before_the_first_byte_still_settles(stack: Stack) -> None:
    """A client gone before any byte of its stream: the attempt settles uncertain.

    The upstream (mock-slow-start-slow-stream) pauses before answering, then streams
    slowly; the client hangs up once the admission is visible in /v1/usage, i.e. while
    the gateway still waits for upstream headers. The permit must not stay pending.
    """
    key = stack.team_key("disconnect-early", "--usd-micros-per-day", "10000000")
    stack.clear_ledger()
    body = json.dumps({"model": "gpt-slow-start", "max_tokens": 40, "stream": True,
                       "messages": [{"role": "user", "content": "never mind"}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", stack.gateway.port)) as sock:
        sock.sendall(head + body)
        end = time.monotonic() + 60
        while not stack.team_usage(key)["usd_reserved"]:  # admitted, upstream not answered
            assert time.monotonic() < end, "never admitted"
            time.sleep(0.02)
    usage = _wait_settled(stack, key)
    team_id = stack.usage(key)[("team", "day")]["id"]
    [line] = [a for a in stack.audit() if a.get("team_id") == team_id
              and a.get("event") == "settled"]
    assert line["outcome"] == "uncertain"
    assert usage["usd_committed"] + usage["usd_liability"] == line["usd_bound"]
    assert usage["tokens_committed"] + usage["tokens_liability"] == line["token_bound"]
    assert stack.ledger() == []  # the upstream never got to report usage
