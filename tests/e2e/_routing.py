"""A routed stack for the routing tests: one upstream process per deployment (each its own
server, as a region is, with its own prompt cache) and one gateway whose models spread
over them (``models[].routing``). An ``anthropic``/``openai`` deployment is a ``mayu
mock-upstream``; a ``bedrock`` one is ``tests/e2e/_bedrock_peer.py`` (SigV4 checked, the
AWS event-stream framing) in its own region, signed for with a static key."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e._procs import Proc, create_key, create_team, free_port, start, wait_ready
from tests.e2e.conftest import ADMIN_TOKEN, MAX_BODY, MAX_OUTPUT, PRICE

PEER = Path(__file__).with_name("_bedrock_peer.py")
AWS_KEY = ("AKIDROUTINGPEER001", "routing-peer-secret-0123456789abcdef")
AWS_ENV = {"ROUTING_AK": AWS_KEY[0], "ROUTING_SK": AWS_KEY[1]}


def start_bedrock_region(workdir: Path, region: str) -> Proc:
    """The Bedrock peer for one region, with its own prompt cache."""
    port = free_port()
    log_path = workdir / f"bedrock-{region}-{port}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen([sys.executable, str(PEER), "--port", str(port),
                                  "--sts-port", str(free_port()), "--region", region,
                                  "--key", ":".join(AWS_KEY), "--prompt-cache"],
                                 stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    return wait_ready(Proc(popen=popen, port=port, log_path=log_path))


def _provider(name: str, kind: str, proc: Proc) -> dict[str, Any]:
    if kind.startswith("bedrock"):
        region = kind.partition(":")[2]
        return {"name": name, "kind": "bedrock", "base_url": proc.url, "timeout_s": 30,
                "credentials": {"kind": "aws", "region": region,
                                "access_key_id_ref": "env:ROUTING_AK",
                                "secret_access_key_ref": "env:ROUTING_SK"}}
    return {"name": name, "kind": kind, "timeout_s": 30,
            "base_url": proc.url + ("/v1" if kind == "openai" else "")}


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
    kinds: dict[str, str]

    def key(self, team: str, *limits: str) -> str:
        create_team(self.config, team, *limits)
        return create_key(self.config, team)

    def ledger(self, provider: str) -> list[dict[str, Any]]:
        where = "__peer" if self.kinds[provider].startswith("bedrock") else "__mock"
        entries: list[dict[str, Any]] = httpx.get(
            f"{self.upstreams[provider].url}/{where}/ledger").json()
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
        "providers": [_provider(p, kind, upstreams[p]) for p, kind in providers.items()],
        "models": [{"price": PRICE, **m} for m in models], **(extra or {})}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_routed_gateway(config: Path, env: dict[str, str] | None = None) -> Proc:
    port = free_port()
    return wait_ready(start(["serve", "--config", str(config), "--port", str(port),
                             "--log-level", "warning"], port=port,
                            log_path=config.parent / f"gateway-{port}.log",
                            env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN, **AWS_ENV,
                                 **(env or {})}))


def start_routed(workdir: Path, providers: dict[str, str], models: list[dict[str, Any]],
                 *, prompt_cache: bool = True) -> Routed:
    """Start one upstream per provider (name → kind; ``bedrock:<region>`` for a Bedrock
    region), then the gateway over them."""
    upstreams: dict[str, Proc] = {}
    try:
        for name, kind in providers.items():
            upstreams[name] = (start_bedrock_region(workdir, kind.partition(":")[2])
                               if kind.startswith("bedrock")
                               else start_deployment(workdir, prompt_cache=prompt_cache))
        path = routed_config(workdir, upstreams, providers, models)
        gateway = start_routed_gateway(path)
    except BaseException:
        for proc in upstreams.values():
            proc.stop()
        raise
    return Routed(gateway=gateway, upstreams=upstreams, config=path, kinds=providers)
