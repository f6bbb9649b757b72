"""``mayu models list`` / ``mayu models catalog``: the models in force and the built-in table.

``list`` loads a config exactly as ``mayu serve`` would and prints every model with each
figure the request path uses (prices per class, context window, output ceiling, input
overhead) and where it came from: ``config``, ``catalog <as_of>`` or ``default``.
``catalog`` prints the built-in catalog itself, with each entry's source page and notes.
Both take ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gateway.catalog import CatalogModel, builtin_catalog
from gateway.cli._commands import add_command, command_group
from gateway.config import FIGURES, ModelFigures, load_settings_and_models
from gateway.pricing import CLASSES


def _dollars(micros: int) -> str:
    whole, frac = divmod(micros, 1_000_000)
    return f"${whole}.{f'{frac:06d}'.rstrip('0').ljust(2, '0')}"


def _lifecycle(entry: CatalogModel) -> str:
    retires = f", retires {entry.retires.isoformat()}" if entry.retires else ""
    return f"{entry.status}{retires}"


def _model_json(f: ModelFigures) -> dict[str, Any]:
    entry = f.catalog
    return {
        "name": f.model.name,
        "deployments": [{"provider": d.provider, "upstream_model": d.upstream_model}
                        for d in f.model.deployments],
        "catalog": None if entry is None else {
            "id": entry.id, "provider": entry.provider, "status": entry.status,
            "retires": entry.retires.isoformat() if entry.retires else None,
            "source": entry.source},
        "figures": {name: {"value": f.values[name], "source": f.sources[name]}
                    for name in FIGURES},
    }


def _model_lines(f: ModelFigures) -> list[str]:
    route = " -> ".join(d.provider + (f"/{d.upstream_model}" if d.upstream_model else "")
                        for d in f.model.deployments)
    about = "not in the catalog" if f.catalog is None else \
        f"catalog {f.catalog.id} ({_lifecycle(f.catalog)})"
    lines = [f"{f.model.name}: {route}; {about}"]
    for name in FIGURES:
        value = f.values[name]
        shown = ("none" if value is None else
                 f"{value} µUSD/Mtok ({_dollars(value)})" if name.startswith("price.")
                 else f"{value} tokens")
        lines.append(f"  {name:<22} {shown:<36} {f.sources[name]}")
    return lines


def _list(args: argparse.Namespace) -> int:
    _, figures = load_settings_and_models(args.config)
    if args.json:
        print(json.dumps({"as_of": builtin_catalog().as_of.isoformat(),
                          "models": [_model_json(f) for f in figures]}, indent=2))
        return 0
    for f in figures:
        for line in _model_lines(f):
            print(line)
    return 0


def _entry_json(m: CatalogModel) -> dict[str, Any]:
    return {"id": m.id, "provider": m.provider, "snapshots": list(m.snapshots),
            "price": {c: m.price.per_class(c) for c in CLASSES},
            "max_input_tokens": m.max_input_tokens, "max_output_tokens": m.max_output_tokens,
            "status": m.status, "retires": m.retires.isoformat() if m.retires else None,
            "source": m.source, "note": m.note}


def _catalog(args: argparse.Namespace) -> int:
    catalog = builtin_catalog()
    if args.json:
        print(json.dumps({"as_of": catalog.as_of.isoformat(),
                          "models": [_entry_json(m) for m in catalog.models]}, indent=2))
        return 0
    print(f"built-in model catalog, checked {catalog.as_of.isoformat()} "
          "(µUSD per million tokens: input/output/cache read/5m write/1h write)")
    for m in catalog.models:
        prices = "/".join(str(m.price.per_class(c)) for c in CLASSES)
        aliases = f" (= {', '.join(m.snapshots)})" if m.snapshots else ""
        print(f"  {m.id}{aliases}: {m.provider}, {prices}; window {m.max_input_tokens}, "
              f"max output {m.max_output_tokens}; {_lifecycle(m)}; {m.source}")
    return 0


def register(subparsers: Any) -> None:
    sub = command_group(
        subparsers, "models", summary="the models in force and the built-in model catalog",
        description="Show the models a config serves, with every price and limit and where "
                    "it came from, or the built-in catalog of public prices.")
    listing = add_command(
        sub, "list", _list, summary="every model in force, each figure with its source",
        description="Load a config as 'mayu serve' would and print every model with each "
                    "figure and its source: config, catalog <as_of> or default.")
    listing.add_argument("--config", metavar="FILE", default=None,
                         help="config file (default: none, the built-in local profile)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    table = add_command(
        sub, "catalog", _catalog, summary="the built-in catalog (prices, limits, sources)",
        description="Print the built-in model catalog.")
    table.add_argument("--json", action="store_true", help="machine-readable output")
