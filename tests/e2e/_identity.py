"""An identity stack as real processes: inferplaned brokering credentials for the users
of the tests' OIDC provider (tests/e2e/_oidc.py), and shared-mode gateways that trust it
(``identity.broker``), on one migrated Postgres database.

Teams ``eng`` (a default member budget of :data:`DEFAULT_MEMBER_USD` per day) and ``ml``
exist. Each gateway takes :data:`ADMIN_TOKEN` as a write admin token. inferplaned signs with
:data:`SECRETS` (the first signs; both are published), so a
test can forge credentials with :func:`gateway.identity.derive_key`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from tests.e2e._controlplane import (
    MODEL,
    PRICE,
    WRITER_TOKEN,
    SharedStack,
    shared_gateway_config,
)
from tests.e2e._oidc import CLIENT_ID, OidcProvider
from tests.e2e._procs import ROOT, Proc, _env, run_cli, start_gateway, wait_ready

ISSUER = "https://inferplaned.e2e"
SECRETS = {"IPD_SIGNING_NEW": "new-signing-secret-" + "n" * 24,
           "IPD_SIGNING_OLD": "old-signing-secret-" + "o" * 24}
DEFAULT_MEMBER_USD = 50_000_000
ADMIN_TOKEN = "identity-e2e-admin-write-token"
JWKS_MAX_AGE_S = 2.0
"""The gateways refetch inferplaned's JWKS at least this often (a retired key goes)."""
MODELS = [{"name": MODEL, "price": PRICE, "max_input_tokens": 400_000,
           "deployments": [{"provider": "in-process"}]}]
"""The shared stack's model, with a context window so that Codex's web_search tool (input
the provider adds) can be bounded."""
EXCHANGE = {"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "subject_token_type": "urn:ietf:params:oauth:token-type:id_token"}


def start_identity_stack(oidc: OidcProvider, dsn: str, workdir: Path, *,
                         gateways: int) -> SharedStack:
    """inferplaned with ``identity`` and ``gateways`` shared gateways trusting it."""
    identity = {"issuers": [{"issuer": oidc.issuer, "audience": [CLIENT_ID],
                             "jwks_min_refresh_s": 1.0}],
                "credentials": {"issuer": ISSUER, "lifetime_s": 600,
                                "signing_keys_ref": [f"env:{n}" for n in SECRETS]}}
    stack = SharedStack.start(workdir, dsn, gateways=0, inferplaned={"identity": identity},
                              env=SECRETS)
    try:
        assert stack.control is not None
        broker = {"issuer": ISSUER, "audience": ["mayu"], "algorithms": ["EdDSA"],
                  "user_claim": "sub", "jwks_min_refresh_s": 1.0,
                  "jwks_max_age_s": JWKS_MAX_AGE_S,
                  "jwks_url": f"{stack.control.url}/v1alpha1/jwks.json"}
        env = {"INFERPLANE_DATABASE_URL": dsn}
        for i in range(gateways):
            server = {"replica_id": f"gw{i}", "max_output_tokens": 100_000, "admin_tokens": [
                {"name": "ops", "token_ref": "env:IDT_ADMIN", "access": "write"}]}
            config = shared_gateway_config(workdir, f"gw{i}", extra={
                "identity": {"broker": broker}, "server": server, "models": MODELS})
            stack.config = stack.config or config
            stack.gateways.append(start_gateway(config, env={**env, "IDT_ADMIN": ADMIN_TOKEN}))
        for team in ("eng", "ml"):
            done = run_cli("teams", "create", team, "--config", str(stack.config), env=env)
            assert done.returncode == 0, done.stderr
        done = run_cli("members", "set-default", "eng", "--usd-micros-per-day",
                       str(DEFAULT_MEMBER_USD), "--config", str(stack.config), env=env)
        assert done.returncode == 0, done.stderr
    except BaseException:
        stack.stop()
        raise
    return stack


def identity_stack(oidc: OidcProvider, dsn: str, workdir: Path, *,
                   gateways: int) -> Iterator[SharedStack]:
    """:func:`start_identity_stack` for a fixture to ``yield from``: stopped afterwards."""
    stack = start_identity_stack(oidc, dsn, workdir, gateways=gateways)
    try:
        yield stack
    finally:
        stack.stop()


def exchange(stack: SharedStack, token: str, **form: str) -> httpx.Response:
    """inferplaned's token exchange of the IdP token ``token``."""
    assert stack.control is not None
    return httpx.post(f"{stack.control.url}/v1alpha1/token",
                      data={**EXCHANGE, "subject_token": token, **form}, timeout=30)


def restart_inferplaned(stack: SharedStack, *, signing: list[str]) -> None:
    """Restart inferplaned on its port with only the ``signing`` secrets of
    :data:`SECRETS` listed (the others retired), as a rotation's last step does."""
    control = stack.control
    assert control is not None
    config = stack.workdir / "inferplaned.yaml"
    doc = yaml.safe_load(config.read_text())
    doc["identity"]["credentials"]["signing_keys_ref"] = [f"env:{n}" for n in signing]
    config.write_text(yaml.safe_dump(doc))
    control.stop()
    log_path = stack.workdir / f"inferplaned-{control.port}-restarted.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(control.popen.args, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=str(ROOT), env=_env({"IPD_DSN": stack.dsn,
                                                          "IPD_TOKEN": WRITER_TOKEN,
                                                          **SECRETS}))
    stack.control = wait_ready(Proc(popen=popen, port=control.port, log_path=log_path))
