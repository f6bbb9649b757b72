"""The built-in model catalog: its shipped data is exact integer money the planner accepts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.catalog import CatalogError, CatalogModel, builtin_catalog, parse_catalog
from gateway.ceilings import MAX_AMOUNT
from gateway.pricing import CLASSES, cost_bound_micro_usd

CATALOG = builtin_catalog()
ANTHROPIC = [m for m in CATALOG.models if m.provider in ("anthropic", "bedrock")]
OPENAI = [m for m in CATALOG.models if m.provider == "openai"]


def test_the_shipped_catalog_is_dated_and_sourced() -> None:
    """Every entry names the provider page it was checked against; the table has a date."""
    assert CATALOG.as_of.year >= 2026 and CATALOG.label.startswith("catalog ")
    assert ANTHROPIC and OPENAI
    for m in CATALOG.models:
        assert m.source.startswith(("https://developers.openai.com/",
                                    "https://platform.claude.com/",
                                    "https://docs.aws.amazon.com/bedrock/")), m.id


@given(st.sampled_from(CATALOG.models))
def test_every_price_is_a_nonnegative_int_within_the_ceiling(m: CatalogModel) -> None:
    """No catalog price is a float, a bool, negative or above what one charge may carry."""
    for cls in CLASSES:
        value = m.price.per_class(cls)
        assert type(value) is int and 0 <= value <= MAX_AMOUNT, (m.id, cls, value)
    assert m.price.input > 0 and m.price.output > 0
    assert m.price.cache_read <= m.price.input


@given(st.sampled_from(ANTHROPIC))
def test_anthropic_cache_classes_follow_the_published_multipliers(m: CatalogModel) -> None:
    """Anthropic: 5m write = 1.25 x input, 1h write = 2 x input, read = 0.1 x input, exactly."""
    assert 4 * m.price.cache_write_5m == 5 * m.price.input, m.id
    assert m.price.cache_write_1h == 2 * m.price.input, m.id
    assert 10 * m.price.cache_read == m.price.input, m.id


@given(st.sampled_from(OPENAI))
def test_openai_cache_writes_cost_the_input_price(m: CatalogModel) -> None:
    """OpenAI bills a cache write as input: the write classes equal the input price."""
    assert m.price.cache_write_5m == m.price.cache_write_1h == m.price.input, m.id


@given(st.sampled_from(CATALOG.models), st.data())
def test_any_request_within_the_window_has_an_admissible_bound(m: CatalogModel,
                                                               data: st.DataObject) -> None:
    """The µUSD bound of any input up to the context window and any output up to the
    ceiling is an int the planner accepts."""
    inp = data.draw(st.integers(0, m.max_input_tokens))
    out = data.draw(st.integers(0, m.max_output_tokens))
    bound = cost_bound_micro_usd(inp, out, m.price)
    assert type(bound) is int and 0 < bound <= MAX_AMOUNT


def test_snapshots_resolve_to_their_entry() -> None:
    """A dated snapshot id finds its model; an unknown name finds nothing."""
    haiku = CATALOG.get("claude-haiku-4-5-20251001")
    assert haiku is not None and haiku.id == "claude-haiku-4-5"
    assert CATALOG.get("gpt-5.1-codex") is not None and CATALOG.get("no-such") is None


_ENTRY = """
  - id: {id}
    provider: openai
    snapshots: [{snap}]
    price: {{input: {price}, output: 2}}
    max_input_tokens: 10
    max_output_tokens: 10
    tokenizer: {tokenizer}
    source: https://developers.openai.com/x
"""


@pytest.mark.parametrize(("entries", "message"), [
    ([("a", "a-1", "-1")], r"models\[0\] \(a\)\.price\.input"),
    ([("a", "a-1", "1", "anthropic_count_tokens")], r"models\[0\] \(a\)\.tokenizer"),
    ([("a", "a-1", "1", "gpt2")], r"Invalid enum value .gpt2. - at `\$\.models\[0\]\.tokenizer`"),
    ([("a", "a-1", "1.5")], "Expected `int`"),
    ([("a", "a-1", str(MAX_AMOUNT + 1))], r"models\[0\] \(a\)\.price\.input"),
    ([("a", "x", "1"), ("b", "x", "1")], r"models\[1\] \(b\): 'x' is also models\[0\]"),
])
def test_bad_catalog_data_is_refused_naming_the_entry(
        entries: list[tuple[str, ...]], message: str) -> None:
    """A wrong edit of the catalog file fails loading, naming the entry and field."""
    text = "as_of: 2026-01-01\nmodels:" + "".join(
        _ENTRY.format(id=e[0], snap=e[1], price=e[2],
                      tokenizer=e[3] if len(e) > 3 else "o200k_base") for e in entries)
    with pytest.raises(CatalogError, match=message):
        parse_catalog(text)


def test_docs_list_every_catalog_model_and_its_date() -> None:
    """docs/models.md names the catalog's as_of date and every entry's id."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    assert f"as_of: {CATALOG.as_of.isoformat()}" in text
    for m in CATALOG.models:
        assert f"| `{m.id}`" in text, m.id
