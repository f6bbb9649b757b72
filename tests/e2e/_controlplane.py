"""A shared-mode stack as real processes: inferplaned plus N ``mayu serve`` gateways.

Used by ``tests/e2e/test_publish_enforced.py`` and ``tests/bench/publish.py``. Everything
runs against one migrated Postgres database; the gateways use the built-in ``mock``
provider, so no upstream process is needed. :meth:`SharedStack.stop` stops every process
it started.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e._procs import (
    ROOT,
    Proc,
    _env,
    free_port,
    run_cli,
    shared_stores,
    start_gateway,
    wait_ready,
)

WRITER_TOKEN = "e2e-inferplaned-writer-token"
PRICE = {"input": 1_000_000, "output": 4_000_000, "cache_read": 100_000,
         "cache_write_5m": 1_250_000, "cache_write_1h": 2_000_000}
MODEL = "gpt-local"


def start_inferplaned(workdir: Path, dsn: str, *, extra: dict[str, Any] | None = None,
                      env: dict[str, str] | None = None) -> Proc:
    """inferplaned on ``dsn`` (``extra``: more config sections, e.g. ``identity``)."""
    config = workdir / "inferplaned.yaml"
    config.write_text(yaml.safe_dump({
        "database": {"dsn_ref": "env:IPD_DSN", "pool_min_size": 1, "pool_max_size": 4},
        "auth": {"writer_tokens_ref": {"e2e": "env:IPD_TOKEN"}}, **(extra or {})}))
    port = free_port()
    return serve_inferplaned(config, port=port, log_path=workdir / f"inferplaned-{port}.log",
                             env={"IPD_DSN": dsn, "IPD_TOKEN": WRITER_TOKEN, **(env or {})})


def serve_inferplaned(config: Path, *, port: int, log_path: Path,
                      env: dict[str, str], log_level: str = "warning") -> Proc:
    """``inferplaned serve`` of ``config`` on ``port`` (its output, from ``log_level`` up,
    in ``log_path``), ready."""
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "serve", "--config", str(config),
             "--port", str(port), "--log-level", log_level],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), env=_env(env))
    return wait_ready(Proc(popen=popen, port=port, log_path=log_path))


def shared_gateway_config(workdir: Path, name: str, *,
                          extra: dict[str, Any] | None = None) -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(workdir / name), "demo": False,
        **shared_stores(pool_min_size=1, pool_max_size=8, policy_refresh_s=1.0),
        "server": {"replica_id": name, "max_output_tokens": 100_000},
        "providers": [{"name": "in-process", "kind": "mock"}],
        "models": [{"name": MODEL, "price": PRICE,
                    "deployments": [{"provider": "in-process"}]}], **(extra or {})}))
    return path


@dataclass
class SharedStack:
    workdir: Path
    dsn: str
    control: Proc | None = None
    gateways: list[Proc] = field(default_factory=list)
    config: Path | None = None

    @classmethod
    def start(cls, workdir: Path, dsn: str, *, gateways: int,
              inferplaned: dict[str, Any] | None = None, gateway: dict[str, Any] | None = None,
              env: dict[str, str] | None = None) -> SharedStack:
        """inferplaned and ``gateways`` shared-mode gateways (``inferplaned``/``gateway``:
        more config sections; ``env``: inferplaned's extra environment)."""
        stack = cls(workdir=workdir, dsn=dsn)
        try:
            stack.control = start_inferplaned(workdir, dsn, extra=inferplaned, env=env)
            for i in range(gateways):
                config = shared_gateway_config(workdir, f"gw{i}", extra=gateway)
                stack.config = stack.config or config
                stack.gateways.append(start_gateway(
                    config, env={"INFERPLANE_DATABASE_URL": dsn}))
        except BaseException:
            stack.stop()
            raise
        return stack

    def stop(self) -> None:
        for proc in [*self.gateways, *([self.control] if self.control else [])]:
            proc.stop()

    def team_key(self, team: str) -> str:
        assert self.config is not None
        env = {"INFERPLANE_DATABASE_URL": self.dsn}
        done = run_cli("teams", "create", team, "--config", str(self.config), "--json",
                       env=env)
        assert done.returncode == 0, done.stderr
        done = run_cli("keys", "create", "--team", team, "--config", str(self.config),
                       "--json", env=env)
        assert done.returncode == 0, done.stderr
        key: str = json.loads(done.stdout)["key"]
        return key

    def publish(self, name: str, doc: dict[str, Any]) -> httpx.Response:
        assert self.control is not None
        return httpx.put(f"{self.control.url}/v1alpha1/policies/{name}", json=doc,
                         headers={"Authorization": f"Bearer {WRITER_TOKEN}"}, timeout=30)

    def unpublish(self, name: str) -> httpx.Response:
        assert self.control is not None
        return httpx.delete(f"{self.control.url}/v1alpha1/policies/{name}",
                            headers={"Authorization": f"Bearer {WRITER_TOKEN}"}, timeout=30)

    def control_get(self, path: str, **params: Any) -> Any:
        assert self.control is not None
        r = httpx.get(f"{self.control.url}{path}", params=params,
                      headers={"Authorization": f"Bearer {WRITER_TOKEN}"}, timeout=30)
        r.raise_for_status()
        return r.json()


def budget_policy(name: str, team: str, limit_milli_usd: int) -> dict[str, Any]:
    """A hard daily budget for ``team``: a tiny limit refuses every request (402)."""
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": name},
            "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                                "subject": {"kind": "team", "team": team},
                                "budget": {"limitMilliUSD": limit_milli_usd,
                                           "window": "day", "hardCap": True}}]}}
