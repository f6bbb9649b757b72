"""The built-in mock speaks each protocol as the SDKs' own stream helpers expect.

A newcomer's ``mayu serve`` (no config: the in-process ``mock`` provider, the demo key)
is driven with ``responses.stream`` and ``chat.completions.stream`` of the openai SDK
and ``messages.stream`` of the anthropic SDK, iterated to the end and then asked for
their final answer: each must accumulate the same text the non-streamed call returns,
with the usage the gateway settled.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.e2e._procs import Proc, free_port, start, wait_ready

pytestmark = pytest.mark.e2e

PROMPT = "Tell me about the weather on the coast today."


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, str]]:
    """``mayu serve`` with no config in an empty folder, and the demo key it printed."""
    home = tmp_path_factory.mktemp("mock-helpers")
    port = free_port()
    proc = start(["serve", "--port", str(port)], port=port, log_path=home / "serve.log")
    try:
        wait_ready(proc)
        match = re.search(r"sk-inf-[A-Za-z0-9_-]+", proc.logs())
        assert match, proc.logs()
        yield proc, match.group(0)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def oai(served: tuple[Proc, str]) -> openai.OpenAI:
    proc, key = served
    return openai.OpenAI(base_url=f"{proc.url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def claude(served: tuple[Proc, str]) -> anthropic.Anthropic:
    proc, key = served
    return anthropic.Anthropic(base_url=proc.url, api_key=key, max_retries=0)


def _settled(proc: Proc, endpoint: str, *, seen: int) -> dict[str, Any]:
    """The newest settlement line of ``endpoint`` once there are more than ``seen``."""
    end = time.monotonic() + 30
    while time.monotonic() < end:
        lines = _settlements(proc, endpoint)
        if len(lines) > seen:
            return lines[-1]
        time.sleep(0.05)
    raise AssertionError(f"no settlement of {endpoint}:\n{proc.logs()}")


def _settlements(proc: Proc, endpoint: str) -> list[dict[str, Any]]:
    lines = []
    for path in sorted((proc.log_path.parent / ".mayu").glob("audit-*.jsonl")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            if doc.get("event") == "settled" and doc.get("endpoint") == endpoint:
                lines.append(doc)
    return sorted(lines, key=lambda doc: str(doc["ts"]))


def test_responses_stream_helper_accumulates_the_answer(served: tuple[Proc, str],
                                                        oai: openai.OpenAI) -> None:
    """``responses.stream`` iterated to the end gives the non-streamed text and the usage
    the gateway settled, after the event sequence OpenAI sends."""
    plain = oai.responses.create(model="mock-gpt", input=PROMPT, max_output_tokens=40)
    seen = len(_settlements(served[0], "responses"))
    with oai.responses.stream(model="mock-gpt", input=PROMPT, max_output_tokens=40) as s:
        kinds = [event.type for event in s]
        final = s.get_final_response()
    assert kinds == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.content_part.added",
                     *["response.output_text.delta"] * (len(kinds) - 8),
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert final.output_text == plain.output_text and final.output_text.startswith("w0")
    assert final.status == "completed" and final.usage == plain.usage
    line = _settled(served[0], "responses", seen=seen)
    assert line["outcome"] == "complete" and final.usage is not None
    assert final.usage.output_tokens == line["usage"]["output"]
    assert final.usage.input_tokens == line["usage"]["input"] + line["usage"]["cache_read"]


def test_chat_stream_helper_accumulates_the_answer(served: tuple[Proc, str],
                                                   oai: openai.OpenAI) -> None:
    """``chat.completions.stream`` gives the non-streamed message and the settled usage."""
    messages: Any = [{"role": "user", "content": PROMPT}]
    plain = oai.chat.completions.create(model="mock-gpt", max_tokens=40, messages=messages)
    seen = len(_settlements(served[0], "chat"))
    with oai.chat.completions.stream(model="mock-gpt", max_tokens=40, messages=messages,
                                     stream_options={"include_usage": True}) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    assert final.choices[0].message.content == plain.choices[0].message.content
    assert final.choices[0].finish_reason == plain.choices[0].finish_reason
    assert final.usage is not None and final.usage == plain.usage
    line = _settled(served[0], "chat", seen=seen)
    assert line["outcome"] == "complete"
    assert final.usage.completion_tokens == line["usage"]["output"]


def test_messages_stream_helper_accumulates_the_answer(served: tuple[Proc, str],
                                                       claude: anthropic.Anthropic) -> None:
    """``messages.stream`` gives the non-streamed message (text, stop reason, usage) and
    the usage the gateway settled; its ``text_stream`` joins to the same text."""
    messages: Any = [{"role": "user", "content": PROMPT}]
    plain = claude.messages.create(model="mock-claude", max_tokens=40, messages=messages)
    seen = len(_settlements(served[0], "messages"))
    with claude.messages.stream(model="mock-claude", max_tokens=40, messages=messages) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    [first], [last] = plain.content, final.content
    assert first.type == last.type == "text" and text == last.text == first.text
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.usage.input_tokens == plain.usage.input_tokens
    line = _settled(served[0], "messages", seen=seen)
    assert line["outcome"] == "complete"
    assert final.usage.output_tokens == line["usage"]["output"]
