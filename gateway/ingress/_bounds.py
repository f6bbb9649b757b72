"""The input side of a request's token bound.

Inline text never turns into more tokens than it has bytes, so the body's byte length
plus what the provider adds to every request (chat template, the tool-use system prompt:
``models[].input_overhead_tokens``) bounds the input of a request that carries all of its
input inline. Some requests make
the provider add input the body does not carry: a previous response or conversation
(Responses API), uploaded files, images fetched by URL, documents by URL or file id,
server-side tools (web search, file search, code execution, MCP servers) whose results
are fed back as input. Their input can be any size up to the model's context window, so
for them the bound is the model's ``max_input_tokens``; a model without one refuses them
(400 naming the config key) rather than admit a request whose cost it cannot bound.
"""

from __future__ import annotations

from typing import Any

from gateway.config import ModelSettings
from gateway.errors import BadRequest

_REFERENCE_KEYS = ("previous_response_id", "conversation", "file_id", "container",
                   "vector_store_ids", "mcp_servers")
_URL_KEYS = ("url", "image_url", "file_url", "document_url")
_CLIENT_TOOL_TYPES = ("function", "custom")


def _is_remote_url(value: Any) -> bool:
    if isinstance(value, dict):
        value = value.get("url")
    return isinstance(value, str) and value[:8].lower().startswith(("http://", "https://"))


def _tool_reference(tools: Any, path: str) -> str | None:
    """A server-side tool (anything but a client function) adds input the body lacks."""
    if not isinstance(tools, list):
        return None
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind not in _CLIENT_TOOL_TYPES:
            return f"{path}[{i}].type={kind}"
    return None


def external_input(node: Any, path: str = "") -> str | None:
    """The path of the first part of the body that makes the provider add input, if any."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            if (found := external_input(item, f"{path}[{i}]")) is not None:
                return found
        return None
    if not isinstance(node, dict):
        return None
    for key in _REFERENCE_KEYS:
        if node.get(key) not in (None, "", [], {}):
            return f"{path}.{key}".lstrip(".")
    if isinstance(node.get("prompt"), dict) and node["prompt"].get("id"):
        return f"{path}.prompt.id".lstrip(".")
    for key in _URL_KEYS:
        if _is_remote_url(node.get(key)):
            return f"{path}.{key}".lstrip(".")
    source = node.get("source")
    if isinstance(source, dict) and source.get("type") in ("url", "file"):
        return f"{path}.source.type={source['type']}".lstrip(".")
    if (found := _tool_reference(node.get("tools"), f"{path}.tools".lstrip("."))):
        return found
    for key, value in node.items():
        if (isinstance(value, dict | list) and key != "tools"
                and (found := external_input(value, f"{path}.{key}")) is not None):
            return found
    return None


def input_bound(body: bytes, doc: dict[str, Any], model: ModelSettings) -> int:
    """The most input tokens this request can be charged for (see the module docstring)."""
    reason = external_input(doc)
    if reason is None:
        return len(body) + model.input_overhead_tokens
    if model.max_input_tokens is None:
        raise BadRequest(
            f"{reason}: this request makes the provider add input the body does not carry, "
            f"so the gateway cannot bound its cost; the operator must set "
            f"models[].max_input_tokens for model {model.name!r} to allow it",
            param=reason.split(".")[0].split("[")[0])
    return max(len(body), model.max_input_tokens)
