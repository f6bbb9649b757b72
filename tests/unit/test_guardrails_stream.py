"""The streamed-answer filter on each protocol's real event shapes (the scripted mock's),
fed in every cut of the upstream's bytes: no byte of a match goes out, pseudonyms come
back, and the hold-back's cost is measured."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from gateway.guardrails import (
    Guard,
    GuardrailBlocked,
    GuardrailSettings,
    StreamGuard,
    policy_for,
)
from gateway.mock._script import answer

SETTINGS = msgspec.convert({"enabled": True, "actions": {
    "email": "pseudonymize", "private_key": "block"}}, GuardrailSettings)
CARD = "5425 2334 3010 9903"
EMAIL = "ana.lima@example.com"


MASK_ALL = msgspec.convert({"enabled": True}, GuardrailSettings)


def _guard(settings: GuardrailSettings = SETTINGS) -> Guard:
    policy = policy_for(settings, ())
    assert policy is not None
    guard = Guard(policy, "req_test")
    guard.pseudonyms["[EMAIL_1]"] = EMAIL
    return guard


def _events(endpoint: str, text: str, n: int, tool_args: str = "") -> bytes:
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": 1000,
                            "messages": [{"role": "user", "content": "hi"}]}
    spec: dict[str, Any] = {"text": text, "n": n}
    if tool_args:
        spec["tool"] = {"name": "send", "arguments": tool_args, "n": n}
    _, events = answer(endpoint, body, spec)  # type: ignore[arg-type]
    assert isinstance(events, list)
    return b"".join(events)


def _text(endpoint: str, out: bytes) -> tuple[str, str]:
    """(the text deltas joined, the tool-call argument deltas joined) a client reads."""
    text, args = "", ""
    for raw in out.split(b"\n\n"):
        data = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
        if not data or data[0] == b"[DONE]":
            continue
        doc = msgspec.json.decode(data[0])
        if endpoint == "chat":
            for c in doc.get("choices", []):
                text += c["delta"].get("content") or ""
                for call in c["delta"].get("tool_calls") or []:
                    args += call["function"].get("arguments", "")
        elif endpoint == "messages" and doc.get("type") == "content_block_delta":
            text += doc["delta"].get("text", "")
            args += doc["delta"].get("partial_json", "")
        elif doc.get("type") == "response.output_text.delta":
            text += doc["delta"]
        elif doc.get("type") == "response.function_call_arguments.delta":
            args += doc["delta"]
    return text, args


def _run(endpoint: str, raw: bytes, cut: int,
         settings: GuardrailSettings = SETTINGS) -> bytes:
    """The filter fed complete events in pieces of about ``cut`` bytes (as the relay
    hands it what the meter completed)."""
    sg = StreamGuard(_guard(settings), endpoint)
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    out = b""
    batch = b""
    for event in events:
        batch += event
        if len(batch) >= cut:
            out += sg.feed(batch)
            batch = b""
    return out + sg.feed(batch) + sg.finish()


@pytest.mark.parametrize("endpoint", ["chat", "responses", "messages"])
@pytest.mark.parametrize("n", [2, 3, 10, 40])
def test_split_card_masked_and_placeholder_restored(endpoint: str, n: int) -> None:
    """A card split across ``n`` deltas never goes out; a placeholder split across them
    comes back as the original, in text and tool-call arguments alike."""
    text = f"Reply to [EMAIL_1] about card {CARD}, thanks."
    args = '{"to": "[EMAIL_1]", "card": "' + CARD + '"}'
    raw = _events(endpoint, text, n, args)
    for cut in (1, 300):
        out = _run(endpoint, raw, cut)
        got, got_args = _text(endpoint, out)
        assert got == f"Reply to {EMAIL} about card [CARD], thanks."
        assert msgspec.json.decode(got_args) == {"to": EMAIL, "card": "[CARD]"}
        assert CARD.encode() not in out and b"2334 3010" not in out


def test_private_key_blocked_before_any_of_it_leaves() -> None:
    """A private key in the answer raises (the relay cuts the stream) before any of its
    lines went out, split in 10."""
    pem = ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oqhuqZ8e5Z\n"
           "oAoGCCqGSM49AwEHoUQDQgAEjU0y1Z0hE1qkFGDQ8XAfE7PWtq7d5MrHOt4jWuuEtw==\n"
           "-----END EC PRIVATE KEY-----")
    raw = _events("messages", f"Here:\n{pem}\nDone.", 10)
    sg = StreamGuard(_guard(), "messages")
    sent = b""
    with pytest.raises(GuardrailBlocked, match="private_key"):
        for event in raw.split(b"\n\n"):
            sent += sg.feed(event + b"\n\n")
        sent += sg.finish()
    assert b"MHcCAQEEIBkg" not in sent and b"BEGIN EC" not in sent


def test_holdback_cost_is_small() -> None:
    """The filter's CPU per KB of streamed answer, and the text held before the first
    release (the time-to-first-token cost), printed; both bounded."""
    words = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do " * 200)
    raw = _events("chat", words, 400)
    start = time.process_time()
    out = _run("chat", raw, 1)
    per_kb = (time.process_time() - start) / (len(words) / 1024) * 1000
    sg = StreamGuard(_guard(), "chat")
    first = b""
    held = 0
    for event in (e + b"\n\n" for e in raw.split(b"\n\n") if e):
        first = sg.feed(event)
        held += 1
        if _text("chat", first)[0]:
            break
    print(f"stream filter: {per_kb:.3f} ms CPU per KB; first text released after "
          f"{held} events (hold-back {SETTINGS.holdback_chars} chars)")
    assert _text("chat", out)[0] == words
    assert per_kb < 20


def test_every_split_point_at_the_minimal_holdback() -> None:
    """At the smallest hold-back (16), a text with a spaced card, IBAN and phone number,
    an email, an AWS key and a secret after its name is cut at every position (and in
    three at random): no planted value, nor 8 characters of one, ever goes out."""
    import random
    values = ["4539 1488 0343 6467", "DE89 3704 0044 0532 0130 00", "+1 415 555 0199",
              "ana.lima@example.com", "AKIAIOSFODNN7EXAMPLE", "q8Z!vR2#mK9@xL4pW7"]
    text = (f"card {values[0]}, iban {values[1]}; call {values[2]} or {values[3]}. "
            f"key {values[4]} and password = {values[5]} end")
    rng = random.Random(39)
    cuts = [[i] for i in range(1, len(text))]
    cuts += [sorted(rng.sample(range(1, len(text)), 2)) for _ in range(200)]
    for points in cuts:
        bounds = [0, *points, len(text)]
        parts = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        _, events = answer("chat", {"model": "m", "stream": True, "max_tokens": 1000,
                                    "messages": []}, {"parts": parts})
        raw = b"".join(events)  # type: ignore[arg-type]
        out = _run("chat", raw, 1, MASK_ALL)
        got = _text("chat", out)[0]
        for value in values:
            assert value not in got and value[:8] not in got, (points, got)
        assert got.startswith("card [CARD], iban [IBAN]; call [PHONE] or [EMAIL]. key "
                              "[AWS_KEY] and password = [SECRET] end"[:len(got)])
