"""Configured models merged with the built-in catalog, and where every figure came from.

A ``models:`` entry whose name is a catalog id or snapshot — or that says ``catalog:
<id>`` — takes the catalog's figure for every catalog-backed field it does not set: each
price class, ``max_input_tokens`` (the context window) and ``max_output_tokens``. "Does
not set" means the key is absent from the YAML mapping, so an explicit value always wins,
even ``max_input_tokens: null`` (refuse provider-added input for that model). The merged
models keep concrete values, so the request path reads them as before.

A figure's source is ``config`` (the file set it), ``catalog <as_of>`` or ``default``
(the field's built-in default, for models the catalog does not know).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.catalog import Catalog, CatalogModel
from gateway.config._settings import ModelSettings, Settings
from gateway.errors import ConfigError
from gateway.pricing import CLASSES, ModelPrice

PRICE_FIGURES = tuple(f"price.{cls}" for cls in CLASSES)
FIGURES = (*PRICE_FIGURES, "max_input_tokens", "max_output_tokens", "input_overhead_tokens")
"""Every figure ``mayu models list`` reports, in its order."""
CONFIG, DEFAULT = "config", "default"


@dataclass(frozen=True)
class ModelFigures:
    """One model in force: its figures and, per figure, where it came from."""

    model: ModelSettings
    catalog: CatalogModel | None
    values: dict[str, int | None]
    sources: dict[str, str]


def _values(m: ModelSettings) -> dict[str, int | None]:
    values: dict[str, int | None] = {f"price.{c}": m.price.per_class(c) for c in CLASSES}
    values.update(max_input_tokens=m.max_input_tokens, max_output_tokens=m.max_output_tokens,
                  input_overhead_tokens=m.input_overhead_tokens)
    return values


def _keys(raw: Any) -> tuple[set[str], set[str]]:
    """The keys a YAML model mapping sets, and the price classes it sets."""
    if not isinstance(raw, Mapping):
        return set(), set()
    price = raw.get("price")
    return set(raw), set(price) if isinstance(price, Mapping) else set()


def _entry(i: int, m: ModelSettings, catalog: Catalog) -> CatalogModel | None:
    if m.catalog is None:
        return catalog.get(m.name)
    entry = catalog.get(m.catalog)
    if entry is None:
        raise ConfigError(f"models[{i}].catalog: {m.catalog!r} is not in the built-in "
                          f"catalog ({catalog.label}); 'mayu models catalog' lists it")
    return entry


def _merge(i: int, m: ModelSettings, raw: Any, catalog: Catalog) -> ModelFigures:
    keys, classes = _keys(raw)
    entry = _entry(i, m, catalog)
    if entry is None:
        sources = {f: CONFIG if f in keys else DEFAULT for f in FIGURES}
        sources.update({f"price.{c}": CONFIG if c in classes else DEFAULT for c in CLASSES})
        return ModelFigures(model=m, catalog=None, values=_values(m), sources=sources)
    price = ModelPrice(**{c: m.price.per_class(c) if c in classes
                          else entry.price.per_class(c) for c in CLASSES})
    changes: dict[str, Any] = {"price": price}
    for field in ("max_input_tokens", "max_output_tokens"):
        if field not in keys:
            changes[field] = getattr(entry, field)
    if m.catalog is not None and m.catalog != m.name:
        # The gateway's name is an alias of the catalog model: send the catalog id upstream
        # unless a deployment names its own upstream model.
        changes["deployments"] = [d if d.upstream_model else
                                  msgspec.structs.replace(d, upstream_model=m.catalog)
                                  for d in m.deployments]
    merged = msgspec.structs.replace(m, **changes)
    sources = {f"price.{c}": CONFIG if c in classes else catalog.label for c in CLASSES}
    for field in ("max_input_tokens", "max_output_tokens"):
        sources[field] = CONFIG if field in keys else catalog.label
    sources["input_overhead_tokens"] = CONFIG if "input_overhead_tokens" in keys else DEFAULT
    return ModelFigures(model=merged, catalog=entry, values=_values(merged), sources=sources)


def resolve_models(models: Sequence[ModelSettings], raw: Any, *,
                   catalog: Catalog) -> list[ModelFigures]:
    """Merge each model with its catalog entry.

    ``raw`` is the YAML ``models`` list the models were decoded from, or ``None`` for the
    built-in demo models (no file): those are the gateway's defaults, taken as they are.
    """
    if not isinstance(raw, list):
        return [ModelFigures(model=m, catalog=None, values=_values(m),
                             sources=dict.fromkeys(FIGURES, DEFAULT)) for m in models]
    return [_merge(i, m, r, catalog) for i, (m, r) in enumerate(zip(models, raw, strict=True))]


def check_output_caps(settings: Settings) -> None:
    """Every ``default_output_tokens`` (model or deployment) at most the model's
    ``max_output_tokens`` (a cap above it would raise the bound and ask the upstream for
    more than the model can give) and ``server.max_output_tokens`` (a limit above it is
    refused request by request), checked after the catalog merge; names the key."""
    ceiling = settings.server.max_output_tokens
    for i, m in enumerate(settings.models):
        caps = [(f"models[{i}].default_output_tokens", m.default_output_tokens)]
        caps += [(f"models[{i}].deployments[{j}].default_output_tokens",
                  d.default_output_tokens) for j, d in enumerate(m.deployments)]
        for key, cap in caps:
            if cap is None:
                continue
            if cap > m.max_output_tokens:
                raise ConfigError(f"{key}: {cap} is above the model's max_output_tokens "
                                  f"({m.max_output_tokens}); a cap can only lower the "
                                  "output allowance")
            if cap > ceiling:
                raise ConfigError(f"{key}: {cap} is above server.max_output_tokens "
                                  f"({ceiling}), which refuses such a limit")
