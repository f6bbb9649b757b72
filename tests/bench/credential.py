"""Credential bench (a script, not a test): what a brokered gateway credential costs a
request against a virtual key, in one run.

1. In process: CPU per call of what the request path does with the presented secret —
   a key's SHA-256; a credential's first use (EdDSA signature and claims verified,
   ``gateway.identity.GatewayCredentials``); a credential already verified (its SHA-256
   and a dict lookup).
2. Real processes (tests/e2e/_identity.py: the OIDC provider from npm, inferplaned, one
   shared-profile ``mayu serve`` on a fresh migrated database): ``--requests``
   sequential requests (concurrency 1) with a key, then with one credential (cached after
   its first use), then each with a fresh credential (first use every time); p50 latency
   and the gateway's CPU per request (``/proc/<pid>/stat``) for each, targets alternating
   per round.

    INFERPLANE_TEST_PG_DSN=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python tests/bench/credential.py [--rounds 3] [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gateway.identity import (  # noqa: E402
    CredentialIssuer,
    CredentialSettings,
    GatewayCredentials,
    IssuerSettings,
)
from gateway.keys import hash_key, new_key  # noqa: E402
from tests.bench.speed import tree_cpu  # noqa: E402

MODEL = "gpt-local"
BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def in_process(n: int) -> dict[str, float]:
    """µs of CPU per call: key hash, credential first use, credential cached."""
    settings = CredentialSettings(issuer="https://ipd.bench", signing_keys_ref=["env:X"])
    issuer = CredentialIssuer(settings, ["bench-signing-secret-" + "x" * 24])
    jwks = issuer.jwks()
    transport = httpx.MockTransport(lambda _: httpx.Response(200, json=jwks))
    accept = GatewayCredentials(IssuerSettings(
        issuer="https://ipd.bench", audience=("mayu",), algorithms=("EdDSA",),
        user_claim="sub", jwks_url="https://ipd.bench/jwks"))
    accept.verifier.jwks._client = httpx.AsyncClient(transport=transport)
    creds = [issuer.issue(user=f"u{i}", team="t", key_hash=hash_key(str(i)))[0]
             for i in range(n)]
    keys = [new_key()[0] for _ in range(n)]

    async def run() -> dict[str, float]:
        await accept.key_hash(creds[0])  # the JWKS fetch, outside the figures
        t = time.process_time()
        for k in keys:
            hash_key(k)
        key_us = (time.process_time() - t) / n * 1e6
        t = time.process_time()
        for c in creds:
            await accept.key_hash(c)
        first_us = (time.process_time() - t) / n * 1e6
        t = time.process_time()
        for c in creds:
            await accept.key_hash(c)
        cached_us = (time.process_time() - t) / n * 1e6
        return {"key": key_us, "credential, first use": first_us,
                "credential, cached": cached_us}

    return asyncio.run(run())


def _one_run(url: str, secrets: list[str], pid: int) -> tuple[float, float]:
    """(p50 ms, gateway CPU ms per request) of one sequential request per secret."""
    lat: list[float] = []
    with httpx.Client(timeout=30) as client:
        cpu = tree_cpu(pid)
        for secret in secrets:
            t = time.perf_counter()
            r = client.post(f"{url}/v1/chat/completions", json=BODY,
                            headers={"Authorization": f"Bearer {secret}"})
            lat.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
        cpu = tree_cpu(pid) - cpu
    return statistics.median(lat) * 1e3, cpu / len(secrets) * 1e3


def processes(rounds: int, requests: int) -> dict[str, tuple[float, float]]:
    """name → (p50 ms, CPU ms per request), medians over the rounds."""
    from tests.conftest import cloned_database, migrate
    from tests.e2e._controlplane import SharedStack
    from tests.e2e._identity import exchange, identity_stack
    from tests.e2e._oidc import install_provider, start_provider
    from tests.e2e._procs import run_cli

    server = os.environ.get("INFERPLANE_TEST_PG_DSN",
                            "postgresql://postgres@127.0.0.1:5432/postgres")
    work = Path(tempfile.mkdtemp(prefix="credential-bench-"))
    (work / "oidc").mkdir()
    oidc = start_provider(install_provider(work / "oidc"), work)
    figures: dict[str, list[tuple[float, float]]] = {}
    try:
        with cloned_database(server, "template0", "credential_bench") as dsn:
            migrate(dsn)
            for stack in identity_stack(oidc, dsn, work, gateways=1):
                assert stack.config is not None
                gw = stack.gateways[0]
                made = run_cli("keys", "create", "--team", "eng", "--config",
                               str(stack.config), "--json",
                               env={"INFERPLANE_DATABASE_URL": dsn})
                key = json.loads(made.stdout)["key"]

                def credential(stack: SharedStack = stack) -> str:
                    r = exchange(stack, oidc.token("bench", groups=["eng"]))
                    return str(r.json()["access_token"])

                one = credential()
                fresh = [credential() for _ in range(requests * rounds)]
                for rnd in range(rounds):
                    chunk = fresh[rnd * requests:(rnd + 1) * requests]
                    for name, secrets in (("key", [key] * requests),
                                          ("credential, cached", [one] * requests),
                                          ("credential, first use", chunk)):
                        figures.setdefault(name, []).append(
                            _one_run(gw.url, secrets, gw.popen.pid))
    finally:
        oidc.stop()
    return {name: (statistics.median(f[0] for f in runs), statistics.median(f[1] for f in runs))
            for name, runs in figures.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=300, help="per target and round")
    ap.add_argument("--calls", type=int, default=2000, help="in-process calls per figure")
    args = ap.parse_args()
    print("in process, CPU µs per call:")
    for name, us in in_process(args.calls).items():
        print(f"  {name:24s} {us:8.1f}")
    print(f"shared-profile mayu, concurrency 1, {args.requests} requests x {args.rounds} "
          "rounds (medians):")
    results = processes(args.rounds, args.requests)
    base = results["key"]
    for name, (p50, cpu) in results.items():
        print(f"  {name:24s} p50 {p50:6.2f} ms ({p50 - base[0]:+.2f})   "
              f"CPU {cpu:6.3f} ms/request ({cpu - base[1]:+.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
