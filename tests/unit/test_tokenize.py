"""Exact input counts for OpenAI models (gateway.ingress._tokenize): the shipped encodings
are OpenAI's, the ceiling is never below and the floor never above what a model reads."""

from __future__ import annotations

import contextlib
import gzip
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.catalog import builtin_catalog
from gateway.config import Deployment, ModelSettings
from gateway.ingress import _tokenize
from gateway.ingress._bounds import external_input, input_bound, input_classes
from gateway.ingress._prepare import output_bound
from gateway.ingress._tokenize import (
    encoding,
    encoding_name,
    input_ceiling,
    input_floor,
    proven_input,
)
from gateway.pricing import ModelPrice, Usage, cost_bound_micro_usd, cost_micro_usd
from tests.openai_render import SYSTEM, render_tokens

OVERHEAD = 96
"""Room for the provider's own system message only (the reference one is 75 tokens with
its delimiters), so the per-string and per-object allowances alone must cover every
message's framing."""
GPT5 = ModelSettings(name="gpt-5.1-codex", deployments=[Deployment(provider="p")],
                     input_overhead_tokens=OVERHEAD, max_output_tokens=128_000)
O200K = encoding("o200k_base")


def _model(name: str, *upstream: str, catalog: str | None = None) -> ModelSettings:
    return ModelSettings(name=name, catalog=catalog,
                         deployments=[Deployment(provider="p", upstream_model=u)
                                      for u in upstream] or [Deployment(provider="p")])


def test_the_system_message_fits_the_tests_overhead() -> None:
    """The reference system message is within the overhead the tests allow for it."""
    assert O200K is not None
    assert len(O200K.encode_ordinary(SYSTEM)) + 4 <= OVERHEAD


@pytest.mark.parametrize(("model", "expected"), [
    (_model("gpt-5.1-codex"), "o200k_base"),
    (_model("gpt-4o-mini"), "o200k_base"),
    (_model("codex", "gpt-5.5", catalog="gpt-5.5"), "o200k_base"),
    (_model("codex", "gpt-5.5"), None),  # not a catalog model: no word on what it is
    (_model("gpt-5-local", "gpt-5"), None),  # named like one, but not in the catalog
    (_model("gpt-5", "gpt-4-0613"), None),  # deployments of different encodings
    (_model("gpt-5", "mock-gpt"), None),  # an upstream model the table does not know
    (_model("gpt-6.2-sol"), "o200k_base"),  # OpenAI's table does not name it: the catalog does
    (_model("claude-sonnet-4-6"), None),
    (_model("m"), None),
])
def test_the_encoding_is_openais_own_table_for_every_name(
        model: ModelSettings, expected: str | None) -> None:
    """A model is counted only when it is an OpenAI model of the catalog and the catalog
    (else OpenAI's table) names one encoding for it and every upstream model it is sent as."""
    assert encoding_name(model) == expected


def test_every_catalog_model_names_a_tokenizer_the_gateway_has() -> None:
    """Each catalog entry names a tokenizer this module has (a local one loads), and
    agrees with OpenAI's own table wherever that names the model."""
    from tiktoken.model import encoding_name_for_model

    for entry in builtin_catalog().models:
        assert _tokenize.TOKENIZERS.get(entry.tokenizer) is not None, entry.id
        if _tokenize.TOKENIZERS[entry.tokenizer] == "local":
            assert encoding(entry.tokenizer) is not None, entry.id
            assert encoding_name(_model(entry.id)) == entry.tokenizer
        for name in entry.names:
            # a model the table does not name yet (KeyError): the catalog's word stands
            with contextlib.suppress(KeyError):
                assert encoding_name_for_model(name) == entry.tokenizer, name


CODEX_TURN = {"model": "gpt-6.2-sol", "stream": True,
              "instructions": "You are Codex, a coding agent. " * 40,
              "input": [{"type": "message", "role": "user", "content": [
                  {"type": "input_text", "text": "Explain what gateway/ingress does. " * 20}]}],
              "tools": [{"type": "function", "name": "shell", "parameters": {
                  "type": "object", "properties": {"command": {"type": "string"}}}}]}


def test_an_interrupted_codex_turn_on_its_default_model_commits_its_input() -> None:
    """Issue 33: a cut Responses stream to gpt-6.2-sol (Codex's default) proves its
    input text, counted exactly (it committed no input: 80 of 34,818 µUSD)."""
    proven = proven_input("responses", CODEX_TURN, _model("gpt-6.2-sol"))
    assert proven is not None and proven.cache_read > 500
    ceiling = input_ceiling(CODEX_TURN, _model("gpt-6.2-sol"))
    assert ceiling is not None and proven.cache_read <= ceiling


def test_a_model_without_a_tokenizer_is_said_once_in_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    """An unknown model says in the log that its input is not counted, once per model."""
    _tokenize._told.discard("unknown-model-x")
    with caplog.at_level("INFO", logger="mayu.ingress"):
        for _ in range(3):
            assert input_ceiling(CODEX_TURN, _model("unknown-model-x")) is None
            assert input_floor(CODEX_TURN, _model("unknown-model-x")) == 0
    said = [r.getMessage() for r in caplog.records if "unknown-model-x" in r.getMessage()]
    assert len(said) == 1 and "not counted exactly" in said[0], said


def test_a_shipped_file_that_is_not_openais_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank file whose SHA-256 is not the one tiktoken pins is never used."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(b"aGk= 0\n"))
    monkeypatch.setattr(_tokenize.importlib.resources, "files", lambda _: tmp_path)
    assert _tokenize._load("cl100k_base") is None
    monkeypatch.undo()
    assert _tokenize._load("cl100k_base") is not None


def test_a_part_that_is_not_text_keeps_the_byte_bound() -> None:
    """Images, files and unknown parts are not counted: the byte bound stays."""
    doc = {"model": "gpt-5.1-codex", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}
    body = msgspec.json.encode(doc)
    assert input_ceiling(doc, GPT5) is None
    assert input_bound(body, doc, GPT5) == len(body) + OVERHEAD


def test_encrypted_reasoning_counts_at_its_bytes() -> None:
    """Reasoning the provider decrypts and feeds back counts a token per byte, and is
    never part of the floor."""
    blob = "gAAAAB" + "x" * 3000
    doc = {"model": "gpt-5.1-codex", "input": [
        {"type": "reasoning", "summary": [], "encrypted_content": blob}]}
    assert (input_ceiling(doc, GPT5) or 0) >= 3000 + OVERHEAD
    assert input_floor(doc, GPT5) == 0


@pytest.mark.parametrize(("doc", "where"), [
    ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]},
     "input[0].type=item_reference"),
    ({"model": "m", "input": "hi", "tools": [{"type": "namespace", "name": "ns", "tools": [
        {"type": "function", "name": "f"}, {"type": "web_search"}]}]},
     "tools[0].tools[1].type=web_search"),
])
def test_stored_items_and_hosted_tools_in_a_namespace_need_the_window(
        doc: dict[str, Any], where: str) -> None:
    """An item_reference adds a stored item; a namespace's own hosted tools add input."""
    assert external_input(doc) == where


def test_a_namespace_of_functions_adds_no_input() -> None:
    """Codex's namespace of client functions is inline input like any function tool."""
    doc = {"model": "m", "input": "hi", "tools": [{"type": "namespace", "name": "ns",
                                                  "tools": [{"type": "function", "name": "f"}]}]}
    assert external_input(doc) is None


_words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120)
_name = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True)


@st.composite
def _tool(draw: st.DrawFn, *, chat: bool) -> dict[str, Any]:
    props = {draw(_name): {"type": draw(st.sampled_from(["string", "integer", "boolean"])),
                           "description": draw(_words)}
             for _ in range(draw(st.integers(0, 4)))}
    fn = {"name": draw(_name), "description": draw(_words),
          "parameters": {"type": "object", "properties": props}}
    return {"type": "function", "function": fn} if chat else {"type": "function", **fn}


@st.composite
def _responses(draw: st.DrawFn) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for i in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["user", "assistant", "developer", "call"]))
        if kind == "call":
            items.append({"type": "function_call", "call_id": f"c{i}", "name": draw(_name),
                          "arguments": draw(_words)})
            items.append({"type": "function_call_output", "call_id": f"c{i}",
                          "output": draw(_words)})
        else:
            part = "output_text" if kind == "assistant" else "input_text"
            content: Any = (draw(_words) if draw(st.booleans()) else
                            [{"type": part, "text": draw(_words)}
                             for _ in range(draw(st.integers(1, 3)))])
            items.append({"type": "message", "role": kind, "content": content})
    doc: dict[str, Any] = {"model": "gpt-5.1-codex", "input": items or draw(_words),
                           "stream": True, "store": False,
                           "tools": [draw(_tool(chat=False))
                                     for _ in range(draw(st.integers(0, 3)))]}
    if draw(st.booleans()):
        doc["instructions"] = draw(_words)
    return doc


@st.composite
def _chat(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 6))):
        role = draw(st.sampled_from(["system", "user", "assistant"]))
        messages.append({"role": role, "content": draw(_words)})
    return {"model": "gpt-5.1-codex", "messages": messages, "max_completion_tokens": 64,
            "tools": [draw(_tool(chat=True)) for _ in range(draw(st.integers(0, 2)))]}


@settings(max_examples=300, deadline=None)
@given(st.one_of(_responses(), _chat()))
def test_the_count_brackets_what_the_model_reads(doc: dict[str, Any]) -> None:
    """For any chat or Responses request of text, messages, function calls and tools, the
    floor is at most and the ceiling at least the tokens of its reference rendering."""
    assert O200K is not None
    read = render_tokens(doc, O200K)
    ceiling = input_ceiling(doc, GPT5)
    assert ceiling is not None
    assert input_floor(doc, GPT5) <= read <= ceiling
    assert read <= input_bound(msgspec.json.encode(doc), doc, GPT5) <= ceiling


@settings(max_examples=200, deadline=None)
@given(st.one_of(_responses(), _chat()), st.data(),
       st.integers(0, 10**8).map(lambda q: ModelPrice(
           input=10 * q, output=80 * q, cache_read=q, cache_write_5m=10 * q,
           cache_write_1h=10 * q)))
def test_no_usage_the_model_can_bill_costs_more_than_the_counted_bound(
        doc: dict[str, Any], data: st.DataObject, price: ModelPrice) -> None:
    """With the counted input bound, the µUSD bound still covers any split of the rendered
    input into input and cached input and any output within the request's limit."""
    assert O200K is not None
    read = render_tokens(doc, O200K)
    cached = data.draw(st.integers(0, read))
    endpoint = "chat" if "messages" in doc else "responses"
    out = output_bound(doc, endpoint, GPT5, ceiling=1 << 20)
    usage = Usage(input=read - cached, cache_read=cached,
                  output=data.draw(st.integers(0, out)))
    bound = cost_bound_micro_usd(input_bound(msgspec.json.encode(doc), doc, GPT5), out,
                                 price, input_classes=input_classes(doc))
    assert cost_micro_usd(usage, price) <= bound
