"""Every numeric setting has a range; a value outside it fails naming its key path.

The ranges live in ``gateway/config/_ranges.py``; money, token, rate and limit ranges
use the shared ceilings of ``gateway/ceilings.py`` (the last test pins which).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane.settings import load_config
from gateway.config import _ranges as ranges
from gateway.config import load_settings
from gateway.errors import ConfigError

MOCK = {"providers": [{"name": "m", "kind": "mock"}],
        "models": [{"name": "x", "deployments": [{"provider": "m"}]}]}


def _load(tmp_path: Path, doc: dict[str, object]) -> str:
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    return info.value.message.removeprefix(f"{path}: ")


def _model(**fields: object) -> dict[str, object]:
    return {**MOCK, "models": [{"name": "x", "deployments": [{"provider": "m"}], **fields}]}


BAD = [
    ({"server": {"port": 83876}}, "server.port"),
    ({"server": {"port": 0}}, "server.port"),
    ({"server": {"max_body_bytes": 0}}, "server.max_body_bytes"),
    ({"server": {"max_output_tokens": 0}}, "server.max_output_tokens"),
    ({"server": {"max_output_tokens": 2**41}}, "server.max_output_tokens"),
    ({"server": {"shutdown_grace_s": -1}}, "server.shutdown_grace_s"),
    ({"server": {"shutdown_grace_s": float("nan")}}, "server.shutdown_grace_s"),
    ({"server": {"shutdown_grace_s": float("inf")}}, "server.shutdown_grace_s"),
    ({"server": {"drain_on_disconnect_s": -0.5}}, "server.drain_on_disconnect_s"),
    ({"server": {"journal_fsync_interval_s": 0}}, "server.journal_fsync_interval_s"),
    ({"server": {"settle_wait_s": float("nan")}}, "server.settle_wait_s"),
    ({"server": {"header_timeout_s": 0}}, "server.header_timeout_s"),
    ({"server": {"body_timeout_s": float("inf")}}, "server.body_timeout_s"),
    ({"server": {"keep_alive_s": -1}}, "server.keep_alive_s"),
    ({"server": {"max_header_bytes": 0}}, "server.max_header_bytes"),
    ({"server": {"max_connections": 0}}, "server.max_connections"),
    ({"database": {"pool_min_size": 0}}, "database.pool_min_size"),
    ({"database": {"pool_max_size": 0}}, "database.pool_max_size"),
    ({"database": {"pool_min_size": 5, "pool_max_size": 2}}, "database.pool_min_size"),
    ({"database": {"connect_timeout_s": float("nan")}}, "database.connect_timeout_s"),
    ({"database": {"pool_timeout_s": -2}}, "database.pool_timeout_s"),
    ({"database": {"policy_refresh_s": 0}}, "database.policy_refresh_s"),
    ({"database": {"admission_coalesce": -1}}, "database.admission_coalesce"),
    ({"providers": [{"name": "m", "kind": "mock", "max_connections": 0}]},
     "providers[0].max_connections"),
    ({"providers": [{"name": "m", "kind": "mock", "timeout_s": float("nan")}]},
     "providers[0].timeout_s"),
    ({"providers": [{"name": "m", "kind": "mock", "connect_timeout_s": -1}]},
     "providers[0].connect_timeout_s"),
    ({"providers": [{"name": "m", "kind": "mock", "latency_ms": -1}]},
     "providers[0].latency_ms"),
    (_model(max_output_tokens=0), "models[0].max_output_tokens"),
    (_model(max_input_tokens=2**41), "models[0].max_input_tokens"),
    (_model(input_overhead_tokens=-1), "models[0].input_overhead_tokens"),
    (_model(price={"output": 2**50 + 1}), "models[0].price.output"),
    (_model(price={"cache_read": -1}), "models[0].price.cache_read"),
    (_model(price={"output": 2**40}, max_output_tokens=2**30), "models[0].max_output_tokens"),
    ({"bootstrap_teams": [{"name": "t", "rpm": 0}]}, "bootstrap_teams[0].rpm"),
    ({"bootstrap_teams": [{"name": "t", "tpm": 2**37}]}, "bootstrap_teams[0].tpm"),
    ({"bootstrap_teams": [{"name": "t", "usd_micros_per_day": -1}]},
     "bootstrap_teams[0].usd_micros_per_day"),
    ({"bootstrap_teams": [{"name": "t", "tokens_per_day": 2**51}]},
     "bootstrap_teams[0].tokens_per_day"),
]


@pytest.mark.parametrize(("doc", "key"), BAD, ids=[k for _, k in BAD])
def test_out_of_range_values_fail_naming_their_key(tmp_path: Path, doc: dict[str, object],
                                                   key: str) -> None:
    """Out-of-range, NaN, infinite and negative values are refused, naming the key."""
    message = _load(tmp_path, doc)
    assert message.startswith(key + ":"), message


def test_edges_of_every_range_are_accepted(tmp_path: Path) -> None:
    """The documented edges themselves load: port 1 and 65535, zero grace, pool 1..1."""
    for port in (1, 65535):
        path = tmp_path / f"p{port}.yaml"
        path.write_text(yaml.safe_dump({
            "server": {"port": port, "shutdown_grace_s": 0, "drain_on_disconnect_s": 0,
                       "settle_wait_s": 0},
            "database": {"pool_min_size": 1, "pool_max_size": 1, "admission_coalesce": 0},
            **_model(price={"output": 2**30}, max_output_tokens=2**20)}))
        settings = load_settings(path)
        assert settings.server.port == port and settings.server.shutdown_grace_s == 0


def test_shutdown_grace_defaults_to_thirty_seconds() -> None:
    """server.shutdown_grace_s defaults to 30 s (the chart derives its grace from it)."""
    assert load_settings(None).server.shutdown_grace_s == 30.0


@pytest.mark.parametrize(("doc", "key"), [
    ({"listen": {"port": 0}}, "listen.port"),
    ({"listen": {"port": 70000}}, "listen.port"),
    ({"max_body_bytes": 0}, "max_body_bytes"),
    ({"database": {"pool_max_size": 0}}, "database.pool_max_size"),
    ({"database": {"connect_timeout_s": float("nan")}}, "database.connect_timeout_s"),
    ({"database": {"pool_min_size": 4, "pool_max_size": 2}}, "database.pool_min_size"),
    ({"shutdown_grace_s": -1}, "shutdown_grace_s"),
])
def test_inferplaned_settings_have_ranges_too(tmp_path: Path, doc: dict[str, object],
                                              key: str) -> None:
    """inferplaned's config refuses out-of-range numbers the same way, naming the key."""
    path = tmp_path / "inferplaned.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = info.value.message.removeprefix(f"{path}: ")
    assert message.startswith(key + ":"), message


def test_ranges_are_the_ceilings_the_request_path_enforces() -> None:
    """Rates, limits and token counts are bounded by the ceilings the planner, the key
    stores and the usage checks enforce, so a config accepted here is never refused
    request by request later."""
    from typing import Any, get_args

    from gateway import ceilings

    def ceiling(annotated: Any) -> Any:
        return get_args(annotated)[1].le

    assert ceiling(ranges.Rate) == ceilings.MAX_BUCKET_CAPACITY
    assert ceiling(ranges.Limit) == ceilings.MAX_AMOUNT
    assert ceiling(ranges.Tokens) == ceiling(ranges.TokensOrZero) == \
        ceilings.MAX_TOKENS_PER_CLASS
