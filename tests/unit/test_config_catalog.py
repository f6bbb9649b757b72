"""Config models merged with the built-in catalog: the file wins field by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.catalog import builtin_catalog
from gateway.config import FIGURES, ModelFigures, load_settings, load_settings_and_models
from gateway.errors import ConfigError
from gateway.pricing import CLASSES

CATALOG = builtin_catalog()
LABEL = CATALOG.label
PROVIDERS = """
providers:
  - {name: oa, kind: openai, base_url: "http://127.0.0.1:9/v1"}
  - {name: an, kind: anthropic, base_url: "http://127.0.0.1:9"}
"""


def load(tmp_path: Path, models: str) -> dict[str, ModelFigures]:
    path = tmp_path / "mayu.yaml"
    path.write_text(PROVIDERS + "models:\n" + models)
    _, figures = load_settings_and_models(path)
    return {f.model.name: f for f in figures}


def test_a_model_named_like_a_catalog_model_takes_every_catalog_figure(
        tmp_path: Path) -> None:
    """Name only: prices per class, context window and output ceiling come from the catalog."""
    f = load(tmp_path, "  - {name: gpt-5.1-codex, deployments: [{provider: oa}]}\n")
    entry = CATALOG.get("gpt-5.1-codex")
    assert entry is not None and f["gpt-5.1-codex"].catalog == entry
    model = f["gpt-5.1-codex"].model
    assert model.price == entry.price
    assert (model.max_input_tokens, model.max_output_tokens) == (entry.max_input_tokens,
                                                                 entry.max_output_tokens)
    assert model.input_overhead_tokens == 1024
    sources = f["gpt-5.1-codex"].sources
    assert {sources[n] for n in FIGURES if n != "input_overhead_tokens"} == {LABEL}
    assert sources["input_overhead_tokens"] == "default"


def test_each_field_the_file_sets_overrides_only_that_figure(tmp_path: Path) -> None:
    """One price class and the output ceiling set in the file; the rest stay the catalog's."""
    f = load(tmp_path, """  - name: claude-haiku-4-5-20251001
    deployments: [{provider: an}]
    price: {output: 4000000}
    max_output_tokens: 1000
    input_overhead_tokens: 400
""")["claude-haiku-4-5-20251001"]
    entry = CATALOG.get("claude-haiku-4-5")
    assert entry is not None and f.catalog == entry  # found by its snapshot id
    assert f.model.price.output == 4_000_000
    for cls in CLASSES:
        if cls != "output":
            assert f.model.price.per_class(cls) == entry.price.per_class(cls)
            assert f.sources[f"price.{cls}"] == LABEL
    assert f.model.max_output_tokens == 1000 and f.model.max_input_tokens == 200_000
    assert f.model.input_overhead_tokens == 400
    assert (f.sources["price.output"], f.sources["max_output_tokens"],
            f.sources["input_overhead_tokens"], f.sources["max_input_tokens"]) == (
        "config", "config", "config", LABEL)


def test_an_explicit_null_window_wins_over_the_catalog(tmp_path: Path) -> None:
    """max_input_tokens: null in the file keeps provider-added input refused for the model."""
    f = load(tmp_path, "  - {name: gpt-4.1, deployments: [{provider: oa}], "
                       "max_input_tokens: null}\n")["gpt-4.1"]
    assert f.model.max_input_tokens is None and f.sources["max_input_tokens"] == "config"


def test_catalog_key_aliases_a_model_and_sends_its_id_upstream(tmp_path: Path) -> None:
    """`catalog: <id>` under another name takes the figures; deployments without their
    own upstream_model send the catalog id upstream, the others keep theirs."""
    f = load(tmp_path, """  - name: coder
    catalog: gpt-5.1-codex-mini
    deployments: [{provider: oa}, {provider: oa, upstream_model: pinned}]
""")["coder"]
    entry = CATALOG.get("gpt-5.1-codex-mini")
    assert entry is not None and f.model.price == entry.price
    assert [d.upstream_model for d in f.model.deployments] == ["gpt-5.1-codex-mini", "pinned"]


def test_a_model_outside_the_catalog_keeps_the_defaults(tmp_path: Path) -> None:
    """No catalog entry: unset prices are 0, the ceiling 8192, no window; all 'default'."""
    f = load(tmp_path, "  - {name: in-house, deployments: [{provider: oa}], "
                       "price: {input: 7}}\n")["in-house"]
    assert f.catalog is None and f.model.price.input == 7 and f.model.price.output == 0
    assert (f.model.max_output_tokens, f.model.max_input_tokens) == (8192, None)
    assert f.sources["price.input"] == "config"
    assert {f.sources[n] for n in FIGURES if n != "price.input"} == {"default"}


def test_an_unknown_catalog_id_is_an_error_naming_the_key(tmp_path: Path) -> None:
    """`catalog:` naming no catalog model fails load, naming models[i].catalog."""
    with pytest.raises(ConfigError, match=r"^models\[1\]\.catalog: 'gpt-9' is not in"):
        load(tmp_path, "  - {name: a, deployments: [{provider: oa}]}\n"
                       "  - {name: b, catalog: gpt-9, deployments: [{provider: oa}]}\n")


def test_overrides_are_checked_like_any_config_value(tmp_path: Path) -> None:
    """A negative price set over a catalog model is refused naming its key path."""
    with pytest.raises(ConfigError, match=r"models\[0\]\.price\.input"):
        load(tmp_path, "  - {name: gpt-5.1, deployments: [{provider: oa}], "
                       "price: {input: -1}}\n")


def test_builtin_demo_models_are_reported_as_defaults() -> None:
    """No file: the mock demo models are the gateway's defaults, every figure 'default'."""
    settings, figures = load_settings_and_models(None)
    assert [f.model for f in figures] == settings.models == load_settings(None).models
    assert {s for f in figures for s in f.sources.values()} == {"default"}
