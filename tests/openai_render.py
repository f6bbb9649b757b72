"""A reference rendering of an OpenAI chat or Responses request into the tokens a model
reads, to test the gateway's token counts against (``gateway.ingress._tokenize``).

OpenAI does not publish the template of its hosted models; it publishes the one of its
open-weight models, the *harmony* format (openai/harmony, "OpenAI harmony response
format"): a system message, the developer message with the instructions and the tools as
a TypeScript namespace, then one message per item, each between special tokens. This
renders that format (special tokens count one each, text is encoded with the model's
encoding), so it is a truth model written independently of the code under test.
"""

from __future__ import annotations

import json
from typing import Any, Protocol


class Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


SYSTEM = ("You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
          "2024-06\nCurrent date: 2026-12-04\n\nReasoning: medium\n\n# Valid channels: "
          "analysis, commentary, final. Channel must be included for every message.\n"
          "Calls to these tools must go to the commentary channel: 'functions'.")


def _ts_type(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any"
    kind = schema.get("type")
    if kind == "array":
        return f"{_ts_type(schema.get('items'))}[]"
    if kind == "object":
        props = schema.get("properties") or {}
        inner = "".join(
            (f"// {p['description']}\n" if isinstance(p, dict) and p.get("description")
             else "") + f"{name}?: {_ts_type(p)},\n" for name, p in props.items())
        return "{\n" + inner + "}"
    return {"integer": "number"}.get(str(kind), str(kind) if kind else "any")


def _tools(tools: list[dict[str, Any]]) -> str:
    out = "# Tools\n\n## functions\n\nnamespace functions {\n\n"
    for tool in tools:
        fn = tool.get("function", tool)  # chat nests it, Responses does not
        if fn.get("description"):
            out += f"// {fn['description']}\n"
        if tool.get("type") == "custom":
            out += f"type {fn['name']} = (FREEFORM) => any;\n\n"
            continue
        out += f"type {fn['name']} = (_: {_ts_type(fn.get('parameters'))}) => any;\n\n"
    return out + "} // namespace functions"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def _messages(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(header, text, end token) per message, in order."""
    out: list[tuple[str, str, str]] = []
    items = doc.get("messages") or doc.get("input") or []
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item["role"]
            header = "assistant<|channel|>final" if role == "assistant" else role
            out.append((header, _text(item.get("content", "")), "<|end|>"))
            for call in item.get("tool_calls") or []:  # chat's assistant tool calls
                fn = call["function"]
                out.append((f"assistant<|channel|>commentary to=functions.{fn['name']} "
                            "<|constrain|>json", fn["arguments"], "<|call|>"))
        elif kind == "function_call":
            out.append((f"assistant<|channel|>commentary to=functions.{item['name']} "
                        "<|constrain|>json", item["arguments"], "<|call|>"))
        elif kind == "function_call_output":
            out.append(("functions to=assistant<|channel|>commentary",
                        _text(item["output"]), "<|end|>"))
        else:
            raise ValueError(f"no rendering for {kind!r}")
    return out


def render_tokens(doc: dict[str, Any], enc: Encoding) -> int:
    """How many tokens the model reads for ``doc`` (harmony format)."""
    special = 0
    texts: list[str] = []

    def message(header: str, text: str, end: str) -> None:
        nonlocal special
        parts = header.split("<|")
        texts.append(parts[0])
        for part in parts[1:]:  # "channel|>final" → one special token, then its text
            special += 1
            texts.append(part.split("|>", 1)[1])
        special += 3  # <|start|>, <|message|>, the end token
        texts.append(text)
        del end

    message("system", SYSTEM, "<|end|>")
    developer = ""
    instructions = doc.get("instructions")
    if isinstance(instructions, str):
        developer += f"# Instructions\n\n{instructions}\n\n"
    if doc.get("tools"):
        developer += _tools(doc["tools"])
    if isinstance(doc.get("response_format"), dict):
        developer += "\n\n# Response Formats\n\n" + json.dumps(doc["response_format"])
    if developer:
        message("developer", developer, "<|end|>")
    for header, text, end in _messages(doc):
        message(header, text, end)
    special += 1  # the final <|start|> before "assistant"
    texts.append("assistant")
    return special + sum(len(enc.encode_ordinary(t)) for t in texts)
