"""A routed stack for the routing tests: one ``mayu mock-upstream`` per deployment (each its
own process, as a region is its own server, with its own prompt cache) and one gateway
whose models spread over them (``models[].routing``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e._procs import Proc, create_key, create_team, free_port, start, wait_ready
from tests.e2e.conftest import ADMIN_TOKEN, MAX_BODY, MAX_OUTPUT, PRICE


def start_deployment(workdir: Path, *, prompt_cache: bool = True) -> Proc:
    """A mock upstream standing for one deployment (``--prompt-cache``: its own cache)."""
    port = free_port()
    proc = start(["mock-upstream", "--port", str(port),
                  *(["--prompt-cache"] if prompt_cache else [])],
                 port=port, log_path=workdir / f"deployment-{port}.log")
    return wait_ready(proc)


@dataclass
class Routed:
    """The gateway, its deployments' upstreams (by provider name) and its config."""

    gateway: Proc
    upstreams: dict[str, Proc]
    config: Path

    def key(self, team: str, *limits: str) -> str:
        create_team(self.config, team, *limits)
        return create_key(self.config, team)

    def ledger(self, provider: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = httpx.get(
            f"{self.upstreams[provider].url}/__mock/ledger").json()
        return entries

    def counts(self, provider: str) -> dict[str, int]:
        counts: dict[str, int] = httpx.get(
            f"{self.upstreams[provider].url}/__mock/counts").json()
        return counts

    def clear(self) -> None:
        for proc in self.upstreams.values():
            httpx.delete(f"{proc.url}/__mock/ledger").raise_for_status()

    def fail(self, provider: str, status: int, retry_after: int | None = None) -> None:
        httpx.post(f"{self.upstreams[provider].url}/__mock/fail",
                   json={"status": status, "retry_after": retry_after}).raise_for_status()

    def heal(self, provider: str) -> None:
        httpx.delete(f"{self.upstreams[provider].url}/__mock/fail").raise_for_status()

    def stop(self) -> None:
        self.gateway.stop()
        for proc in self.upstreams.values():
            proc.stop()


def routed_config(workdir: Path, upstreams: dict[str, Proc], providers: dict[str, str],
                  models: list[dict[str, Any]], *, name: str = "mayu",
                  extra: dict[str, Any] | None = None) -> Path:
    """A gateway config over ``upstreams`` (provider name → its process; ``providers``:
    name → kind). ``models`` are ``models:`` entries (each gets the tests' ``PRICE``
    unless it sets one); ``extra`` is merged into the top of the config."""
    config: dict[str, Any] = {
        "data_dir": str(workdir / f"data-{name}"), "demo": False,
        "server": {"max_body_bytes": MAX_BODY, "max_output_tokens": MAX_OUTPUT,
                   "admin_token_ref": "env:MAYU_E2E_ADMIN_TOKEN", "replica_id": name},
        "providers": [{"name": p, "kind": kind, "timeout_s": 30,
                       "base_url": upstreams[p].url + ("/v1" if kind == "openai" else "")}
                      for p, kind in providers.items()],
        "models": [{"price": PRICE, **m} for m in models], **(extra or {})}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_routed_gateway(config: Path, env: dict[str, str] | None = None) -> Proc:
    port = free_port()
    return wait_ready(start(["serve", "--config", str(config), "--port", str(port),
                             "--log-level", "warning"], port=port,
                            log_path=config.parent / f"gateway-{port}.log",
                            env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN, **(env or {})}))


def start_routed(workdir: Path, providers: dict[str, str], models: list[dict[str, Any]],
                 *, prompt_cache: bool = True) -> Routed:
    """Start one mock upstream per provider (name → kind), then the gateway over them."""
    upstreams: dict[str, Proc] = {}
    try:
        for name in providers:
            upstreams[name] = start_deployment(workdir, prompt_cache=prompt_cache)
        path = routed_config(workdir, upstreams, providers, models)
        gateway = start_routed_gateway(path)
    except BaseException:
        for proc in upstreams.values():
            proc.stop()
        raise
    return Routed(gateway=gateway, upstreams=upstreams, config=path)
