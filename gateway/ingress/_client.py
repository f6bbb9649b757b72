"""Which client tool sent a request, from its User-Agent (the request log's ``client``).

The agents and SDKs people run through the gateway name themselves in the first product
token of their User-Agent: Claude Code ``claude-cli/2.1.197 (external, cli)``, Codex CLI
``codex_cli_rs/0.171.0 …`` (``codex_exec/…`` when run as ``codex exec``), the SDKs
``OpenAI/Python 2.8.1``, ``Anthropic/Python 0.75.0``, ``OpenAI/JS 6.9.1``,
``Anthropic/JS 0.70.0``. Anything else is ``other`` (a request without a User-Agent:
None). Only this short name is stored, never the header itself.
"""

from __future__ import annotations

from functools import lru_cache

_PREFIXES = (
    ("claude-cli/", "claude-code"),
    ("claude-code/", "claude-code"),
    ("codex_cli_rs/", "codex"),
    ("codex_exec/", "codex"),
    ("codex/", "codex"),
    ("openai/python", "openai-python"),
    ("anthropic/python", "anthropic-python"),
    ("openai/js", "openai-node"),
    ("anthropic/js", "anthropic-node"),
    ("litellm/", "litellm"),
    ("curl/", "curl"),
    ("python-httpx/", "httpx"),
    ("python-requests/", "requests"),
)

CLIENTS = tuple(sorted({name for _, name in _PREFIXES} | {"other"}))
"""Every name :func:`client_tool` answers (the request log's filter and grouping)."""

ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses",
          "embeddings": "/v1/embeddings", "messages": "/v1/messages"}
"""The route each generation endpoint is served at (the request log's ``route``)."""


@lru_cache(maxsize=256)
def client_tool(user_agent: str | None) -> str | None:
    """The client tool a User-Agent names (see the module docstring)."""
    agent = (user_agent or "").strip().lower()
    if not agent:
        return None
    for prefix, name in _PREFIXES:
        if agent.startswith(prefix):
            return name
    return "other"
