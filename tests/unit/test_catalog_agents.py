"""The catalog covers what Codex CLI 0.171.0 and Claude Code 2.1.197 ask for (issue 26).

Pinned here as read from the installed packages on 2026-12-04
(tests/e2e/test_catalog_agents_npm.py re-reads them from whatever npm serves today):
Codex's default and the models its picker lists (``codex debug models --bundled``,
visibility "list"), and Claude Code's main and small/fast defaults. Each entry added for
them keeps its source page and the day it was read, and says where OpenAI bills cache
writes it cannot settle.
"""

from __future__ import annotations

from datetime import date

import pytest

from gateway.catalog import CatalogError, builtin_catalog, parse_catalog

CATALOG = builtin_catalog()
READ_ON = date(2026, 12, 4)

CODEX_0_171_DEFAULT = "gpt-6.2-sol"
CODEX_0_171_LISTED = ("gpt-6.2-sol", "gpt-6.2-astra", "gpt-6-astra", "gpt-6.1-sol",
                      "gpt-6.1-terra", "gpt-6-sol", "gpt-6-luna", "gpt-5.6-sol",
                      "gpt-5.6-terra", "gpt-5.6-luna", "gpt-5.5")
CLAUDE_CODE_2_1_197_MAIN = "claude-opus-4-8"
CLAUDE_CODE_2_1_197_SMALL_FAST = "claude-haiku-4-5-20251001"
"""With an Anthropic API key; behind a gateway (a bearer token) it is the main model."""

_OPENAI_PAGE = "https://developers.openai.com/api/docs/models/"
ADDED = {  # id -> the source it was read from on READ_ON
    **{i: _OPENAI_PAGE + i for i in CODEX_0_171_LISTED},
    "claude-opus-4-8": "https://platform.claude.com/docs/en/models/opus-4-8/overview",
}
WRITES_BILLED = ("gpt-6.2-sol", "gpt-6.2-astra", "gpt-6-astra", "gpt-6.1-sol",
                 "gpt-6.1-terra", "gpt-6-sol", "gpt-6-luna", "gpt-5.6-sol",
                 "gpt-5.6-terra", "gpt-5.6-luna")
"""gpt-5.6 and later: OpenAI bills cache writes above input; the gateway settles them as input."""


@pytest.mark.parametrize("name", [CODEX_0_171_DEFAULT, CLAUDE_CODE_2_1_197_MAIN,
                                  CLAUDE_CODE_2_1_197_SMALL_FAST])
def test_the_agents_default_models_resolve_with_a_window(name: str) -> None:
    """Each agent default finds a catalog entry, so it is served with a context window."""
    entry = CATALOG.get(name)
    assert entry is not None, name
    assert entry.max_input_tokens > 0 and entry.max_output_tokens > 0


@pytest.mark.parametrize("name", CODEX_0_171_LISTED)
def test_every_model_codex_lists_is_an_openai_catalog_id(name: str) -> None:
    """Every model Codex 0.171.0's picker offers is an OpenAI entry of its own."""
    entry = CATALOG.get(name)
    assert entry is not None and entry.id == name and entry.provider == "openai", name


@pytest.mark.parametrize(("name", "source"), sorted(ADDED.items()))
def test_added_entries_keep_their_source_and_reading_date(name: str, source: str) -> None:
    """An entry added for the agents names the page it was read from and the day it was read."""
    entry = CATALOG.get(name)
    assert entry is not None
    assert (entry.source, entry.checked) == (source, READ_ON)
    assert entry.note, f"{name}: every added entry says which figures rest on what"


@pytest.mark.parametrize("name", WRITES_BILLED)
def test_billed_cache_writes_are_disclosed_where_they_settle_as_input(name: str) -> None:
    """A model OpenAI bills cache writes for says so, and its write classes are input."""
    entry = CATALOG.get(name)
    assert entry is not None
    assert "settle as input" in entry.note or "settles as input" in entry.note, name
    assert entry.price.cache_write_5m == entry.price.cache_write_1h == entry.price.input


def test_claude_code_main_default_follows_the_anthropic_price_table() -> None:
    """Claude Opus 4.8: $5 / $25 per MTok, 1M window, 128K output, legacy on its page."""
    entry = CATALOG.get(CLAUDE_CODE_2_1_197_MAIN)
    assert entry is not None and entry.status == "legacy"
    assert (entry.price.input, entry.price.output) == (5_000_000, 25_000_000)
    assert (entry.max_input_tokens, entry.max_output_tokens) == (1_000_000, 128_000)


def test_a_reading_date_before_the_catalog_date_is_refused() -> None:
    """``checked`` earlier than ``as_of`` would claim a staler reading than the table's."""
    text = """
as_of: 2026-12-01
models:
  - id: a
    provider: openai
    price: {input: 1, output: 1}
    max_input_tokens: 10
    max_output_tokens: 10
    tokenizer: o200k_base
    source: https://developers.openai.com/x
    checked: 2026-11-30
"""
    with pytest.raises(CatalogError, match=r"models\[0\] \(a\)\.checked"):
        parse_catalog(text)
