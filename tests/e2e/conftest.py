"""End-to-end fixtures: a real mock upstream and a real gateway in front of it.

The gateway config has providers of every kind: ``openai`` and ``anthropic`` pointing at
the ``mayu mock-upstream`` process, and the in-process ``mock``. Model names map to the
mock's behaviour switches (``upstream_model``). ``PRICE`` is the tests' own copy of the
price table; expected costs are computed from it and the upstream's ledger.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from gateway.pricing import ModelPrice, Usage, cost_micro_usd
from tests.e2e._controlplane import SharedStack
from tests.e2e._oidc import OidcProvider, install_provider, start_provider
from tests.e2e._procs import (
    Proc,
    create_key,
    create_team,
    free_port,
    serving,
)

PRICE = {"input": 1_000_000, "output": 4_000_000, "cache_read": 100_000,
         "cache_write_5m": 1_250_000, "cache_write_1h": 2_000_000}
OPUS_PRICE = {"input": 15_000_000, "output": 75_000_000, "cache_read": 1_500_000,
              "cache_write_5m": 18_750_000, "cache_write_1h": 30_000_000}
ADMIN_TOKEN = "e2e-admin-token-0123"  # at least 16 characters, as serve requires
MAX_BODY = 256 * 1024  # room for agent-sized prompts (~108 KB per Claude Code turn)
MAX_OUTPUT = 100_000

_UPSTREAM = {  # gateway model -> (provider, upstream model)
    "gpt-up": ("up-openai", "mock-gpt"),
    "claude-up": ("up-anthropic", "mock-claude"),
    "gpt-neg": ("up-openai", "mock-negative-usage"),
    "gpt-missing": ("up-openai", "mock-missing-usage"),
    "claude-neg": ("up-anthropic", "mock-negative-usage"),
    "claude-nottl": ("up-anthropic", "mock-no-ttl"),
    "gpt-slow": ("up-openai", "mock-slow-stream"),
    "claude-slow": ("up-anthropic", "mock-slow-stream"),
    "gpt-500": ("up-openai", "mock-error-500"),
    "gpt-cut": ("up-openai", "mock-cut-stream"),
    "claude-cut-local": ("in-process", "mock-cut-stream"),
    "gpt-timeout": ("up-short", "mock-slow-stream"),
    "gpt-down": ("down", "mock-gpt"),
    "gpt-slow-start": ("up-openai", "mock-slow-start-slow-stream"),
    "gpt-hidden": ("up-openai", "mock-hidden-input"),
    "claude-cut": ("up-anthropic", "mock-cut-stream"),
}


def expected_cost(entry: dict[str, Any]) -> int:
    """The price of one mock-upstream ledger entry, from the test's own price table."""
    return cost_micro_usd(Usage(**entry["classes"]), ModelPrice(**PRICE))


def cut_stream(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    """POST ``body``, a stream the upstream breaks mid-way, answered 200: (its µUSD bound,
    the bytes that arrived before the break)."""
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        bound = int(r.headers["x-inferplane-usd-bound"])
        text = b""
        with contextlib.suppress(httpx.HTTPError):
            text = r.read()
    return bound, text


def server_section() -> dict[str, Any]:
    """The ``server`` section of the tests' gateways: bodies and outputs of agent size,
    the admin token from ``MAYU_E2E_ADMIN_TOKEN``; a new dict each call (tests edit it)."""
    return {"max_body_bytes": MAX_BODY, "max_output_tokens": MAX_OUTPUT,
            "admin_token_ref": "env:MAYU_E2E_ADMIN_TOKEN"}


def gateway_config(workdir: Path, upstream: Proc) -> Path:
    """:func:`gateway_doc` written to ``workdir/mayu.yaml``."""
    path = workdir / "mayu.yaml"
    path.write_text(yaml.safe_dump(gateway_doc(workdir, upstream)))
    return path


def gateway_doc(workdir: Path, upstream: Proc) -> dict[str, Any]:
    """The e2e gateway's config: every provider kind, the models of ``_UPSTREAM`` and
    the special cases below, in front of the mock ``upstream``."""
    models: list[dict[str, Any]] = [
        {"name": name, "price": PRICE,
         "deployments": [{"provider": provider, "upstream_model": upstream_model}]}
        for name, (provider, upstream_model) in _UPSTREAM.items()]
    models += [
        {"name": "gpt-local", "price": PRICE, "deployments": [{"provider": "in-process"}]},
        {"name": "claude-local", "price": PRICE, "deployments": [{"provider": "in-process"}]},
        {"name": "gpt-fallback", "price": PRICE, "deployments": [
            {"provider": "up-openai", "upstream_model": "mock-error-500"},
            {"provider": "up-openai", "upstream_model": "mock-gpt"}]},
        {"name": "gpt-down-fallback", "price": PRICE, "deployments": [
            {"provider": "down"}, {"provider": "up-openai", "upstream_model": "mock-gpt"}]},
        {"name": "gpt-hidden-windowed", "price": PRICE, "max_input_tokens": 100_000,
         "deployments": [{"provider": "up-openai", "upstream_model": "mock-hidden-input"}]},
        # Its bound (body + 45,500 overhead + max_tokens) sits ~10% below the 50,000 hidden
        # input tokens the upstream reports: valid usage above the bound.
        # Claude-Opus-like prices: Claude Code's max_tokens 32,000 alone is a $2.40 worst case.
        {"name": "claude-opus", "price": OPUS_PRICE,
         "deployments": [{"provider": "up-anthropic", "upstream_model": "mock-claude"}]},
        {"name": "gpt-opus", "price": OPUS_PRICE,
         "deployments": [{"provider": "up-openai", "upstream_model": "mock-gpt"}]},
        {"name": "gpt-over", "price": PRICE, "input_overhead_tokens": 45_500,
         "deployments": [{"provider": "up-openai", "upstream_model": "mock-hidden-input"}]},
    ]
    config = {
        "data_dir": str(workdir / "data"), "demo": False,
        "server": server_section(),
        "providers": [
            {"name": "up-openai", "kind": "openai", "base_url": f"{upstream.url}/v1",
             "timeout_s": 30},
            {"name": "up-anthropic", "kind": "anthropic", "base_url": upstream.url,
             "timeout_s": 30},
            {"name": "in-process", "kind": "mock"},
            # Times out on the mock's slow answers (which take seconds).
            {"name": "up-short", "kind": "openai", "base_url": f"{upstream.url}/v1",
             "timeout_s": 1},
            # Nothing listens there: every call fails to connect (nothing dispatched).
            {"name": "down", "kind": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1",
             "connect_timeout_s": 2}],
        "models": models}
    return config


@dataclass
class Stack:
    gateway: Proc
    upstream: Proc
    config: Path

    def team_key(self, team: str, *limits: str) -> str:
        create_team(self.config, team, *limits)
        return create_key(self.config, team)

    def ledger(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = httpx.get(f"{self.upstream.url}/__mock/ledger").json()
        return entries

    def clear_ledger(self) -> None:
        httpx.delete(f"{self.upstream.url}/__mock/ledger").raise_for_status()

    def usage(self, key: str) -> dict[tuple[str, str], dict[str, Any]]:
        """``/v1/usage`` as seen by ``key``: {(scope, window): row}."""
        r = httpx.get(f"{self.gateway.url}/v1/usage",
                      headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
        return {(row["scope"], row["window"]): row for row in r.json()["data"]}

    def team_usage(self, key: str) -> dict[str, Any]:
        return self.usage(key).get(("team", "day"), {
            "tokens_committed": 0, "tokens_reserved": 0, "usd_committed": 0,
            "usd_reserved": 0, "requests": 0, "tokens_liability": 0, "usd_liability": 0})

    def audit(self) -> list[dict[str, Any]]:
        import json
        lines: list[dict[str, Any]] = []
        for path in sorted((self.config.parent / "data").glob("audit-*.jsonl")):
            lines += [json.loads(line) for line in path.read_text().splitlines() if line]
        return lines


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("e2e")
    with serving(workdir, lambda upstream: gateway_doc(workdir, upstream),
                 env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN}) as (gateway, upstream, config):
        yield Stack(gateway=gateway, upstream=upstream, config=config)


# The real SDKs as clients of the module's ``stack``, with the module's own ``key``.
@pytest.fixture
def oai(stack: Stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key, max_retries=0)


@pytest.fixture
def claude(stack: Stack, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.gateway.url, api_key=key, max_retries=0)


@pytest.fixture
def two_gateways(tmp_path: Path, pg_dsn: str) -> Iterator[SharedStack]:
    """inferplaned and two shared-mode gateways on one fresh migrated database."""
    shared = SharedStack.start(tmp_path, pg_dsn, gateways=2)
    try:
        yield shared
    finally:
        shared.stop()


@pytest.fixture(scope="session")
def oidc_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The identity tests' OIDC provider, installed once from the npm registry."""
    return install_provider(tmp_path_factory.mktemp("oidc-provider"))


@pytest.fixture(scope="module")
def oidc(oidc_script: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """A running OIDC provider for the module (tests/e2e/_oidc.py)."""
    provider = start_provider(oidc_script, tmp_path_factory.mktemp("oidc"))
    try:
        yield provider
    finally:
        provider.stop()
