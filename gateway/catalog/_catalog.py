"""The built-in model catalog: typed entries, read once from the reviewed ``models.yaml``.

The data lives in ``models.yaml`` next to this module (package data), so a price change is
a reviewed one-line diff with its source beside it. Loading checks what the arithmetic
relies on — integer µUSD prices within the planner's ceiling, positive limits, ids and
snapshots unique — so a bad edit fails at import of the first config, naming the entry.
"""

from __future__ import annotations

import functools
from datetime import date
from importlib import resources
from typing import Literal

import msgspec
import yaml

from gateway.ceilings import MAX_AMOUNT
from gateway.pricing import CLASSES, ModelPrice

Provider = Literal["openai", "anthropic", "bedrock"]
"""Who bills the model (``bedrock``: Claude on Amazon Bedrock, by model or inference-profile
id)."""
Lifecycle = Literal["active", "legacy", "deprecated"]
Tokenizer = Literal["o200k_base", "cl100k_base", "anthropic_count_tokens"]
"""How a model's input is counted exactly: an OpenAI encoding the gateway counts with
locally (``gateway.ingress._tokenize``), or the provider's own ``count_tokens``
endpoint (``gateway.providers.TokenCounter``)."""


class CatalogModel(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One model's public figures, as its provider publishes them."""

    id: str
    provider: Provider
    price: ModelPrice
    """µUSD per million tokens, per usage class (standard tier)."""
    max_input_tokens: int
    """The context window."""
    max_output_tokens: int
    tokenizer: Tokenizer
    """How its input is counted exactly (:data:`Tokenizer`)."""
    source: str
    """The provider documentation page the figures were checked against."""
    snapshots: tuple[str, ...] = ()
    """Dated ids that name the same model at the same price."""
    status: Lifecycle = "active"
    retires: date | None = None
    """The provider's announced shutdown / retirement date, if any."""
    note: str = ""
    """Which figures were not confirmed on a provider page, and other caveats."""
    checked: date | None = None
    """The day this entry was read from ``source``, when later than the catalog's
    ``as_of`` (an entry added or re-read after the table's review); ``None``: ``as_of``."""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.snapshots)


class Catalog(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    as_of: date
    """The day the table as a whole was checked against its sources (an entry read later
    carries its own ``checked`` date)."""
    models: tuple[CatalogModel, ...]

    @property
    def label(self) -> str:
        """How a figure taken from this catalog is attributed: ``catalog 2026-12-01``."""
        return f"catalog {self.as_of.isoformat()}"

    def get(self, name: str) -> CatalogModel | None:
        """The entry whose id or snapshot is ``name``."""
        return _index(self).get(name)


class CatalogError(ValueError):
    """The catalog data is inconsistent (a reviewed file was edited wrongly)."""


@functools.cache
def _index(catalog: Catalog) -> dict[str, CatalogModel]:
    return {name: m for m in catalog.models for name in m.names}


def check_catalog(catalog: Catalog) -> Catalog:
    """Refuse data the pricing and bounds code could not use exactly; names the entry."""
    seen: dict[str, str] = {}
    for i, m in enumerate(catalog.models):
        where = f"models[{i}] ({m.id})"
        for cls in CLASSES:
            value = m.price.per_class(cls)
            if isinstance(value, bool) or not isinstance(value, int) \
                    or not 0 <= value <= MAX_AMOUNT:
                raise CatalogError(f"{where}.price.{cls}: must be an integer µUSD/Mtok in "
                                   f"0..{MAX_AMOUNT}, got {value!r}")
        if (m.tokenizer == "anthropic_count_tokens") != (m.provider in ("anthropic", "bedrock")):
            raise CatalogError(f"{where}.tokenizer: {m.tokenizer} is not a {m.provider} "
                               "tokenizer")
        for field in ("max_input_tokens", "max_output_tokens"):
            if getattr(m, field) <= 0:
                raise CatalogError(f"{where}.{field}: must be positive")
        if m.checked is not None and m.checked < catalog.as_of:
            raise CatalogError(f"{where}.checked: {m.checked} is before the catalog's "
                               f"as_of {catalog.as_of}; drop it (as_of applies)")
        for name in m.names:
            if name in seen:
                raise CatalogError(f"{where}: {name!r} is also {seen[name]}")
            seen[name] = where
    return catalog


def parse_catalog(text: str) -> Catalog:
    """Decode and check catalog YAML (the built-in file, or a test's)."""
    try:
        catalog = msgspec.convert(yaml.safe_load(text), Catalog)
    except msgspec.ValidationError as exc:
        raise CatalogError(f"model catalog: {exc}") from exc
    return check_catalog(catalog)


@functools.cache
def builtin_catalog() -> Catalog:
    """The catalog shipped with this version (``gateway/catalog/models.yaml``)."""
    text = resources.files("gateway.catalog").joinpath("models.yaml").read_text("utf-8")
    return parse_catalog(text)
