"""The built-in model catalog: dated public prices and limits of OpenAI and Anthropic models.

A config model that names a catalog model takes its figures for every field it does not
set (``gateway.config`` does the merge); ``mayu models list`` shows where each came from.
"""

from gateway.catalog._catalog import (
    Catalog,
    CatalogError,
    CatalogModel,
    builtin_catalog,
    check_catalog,
    parse_catalog,
)

__all__ = [
    "Catalog",
    "CatalogError",
    "CatalogModel",
    "builtin_catalog",
    "check_catalog",
    "parse_catalog",
]
