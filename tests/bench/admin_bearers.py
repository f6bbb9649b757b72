"""What a person's bearer costs the admin API, against an admin token.

One local-profile app in-process (Litestar's client), one issuer whose JWKS (an RS256
key) and one broker whose JWKS (inferplaned's EdDSA signer) are served over real HTTP
from a thread; R calls of ``GET /admin/v1/teams/alpha`` each with:

- an admin token (constant-time comparison with the configured tokens);
- an IdP token of an admin (RS256 verified on every call: the JWKS is cached, the
  signature and claims are not);
- an IdP token of a team lead (the same, plus the team lookup of the guard);
- a brokered gateway credential (a member; verified once, then cached until its exp,
  then resolved as its key like a request's) on ``/admin/v1/teams/alpha/members/<user>``.

Prints the p50/p99 wall time per call and the process CPU per call of each::

    .venv/bin/python tests/bench/admin_bearers.py [--repeats 500]
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
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.app import create_app  # noqa: E402
from gateway.config import AdminToken, load_settings  # noqa: E402
from gateway.identity import (  # noqa: E402
    CredentialIssuer,
    CredentialSettings,
    IdentitySettings,
    IssuerSettings,
)
from gateway.keys import hash_key  # noqa: E402
from gateway.roles import RoleSettings  # noqa: E402
from tests.json_http import serving  # noqa: E402

IDP, BROKER = "https://idp.bench", "https://inferplaned.bench"
TOKEN = "bench-admin-token-0123456789"


async def _time(c: AsyncTestClient[Any], path: str, bearer: str, repeats: int
                ) -> tuple[float, float, float]:
    """p50 ms, p99 ms, CPU ms per call."""
    headers = {"Authorization": f"Bearer {bearer}"}
    assert (await c.get(path, headers=headers)).status_code == 200  # warm: JWKS, caches
    walls = []
    cpu0 = time.process_time()
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = await c.get(path, headers=headers)
        walls.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200, r.text
    cpu = (time.process_time() - cpu0) * 1000 / repeats
    walls.sort()
    return statistics.median(walls), walls[int(len(walls) * 0.99) - 1], cpu


async def main(repeats: int) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    signer = CredentialIssuer(CredentialSettings(issuer=BROKER, signing_keys_ref=["env:X"]),
                              ["bench-signing-secret-" + "b" * 24])
    with serving({"/jwks": {"keys": [{**jwk, "kid": "k1", "alg": "RS256"}]},
                  "/broker": signer.jwks()}) as base:
        await _run(base, key, signer, repeats)


async def _run(base: str, key: rsa.RSAPrivateKey, signer: CredentialIssuer,
               repeats: int) -> None:
    issuer = IssuerSettings(issuer=IDP, audience=["console"], jwks_url=f"{base}/jwks",
                            roles=RoleSettings(admin=["admins"], team_lead=["leads"]))
    broker = IssuerSettings(issuer=BROKER, audience=["mayu"], algorithms=("EdDSA",),
                            user_claim="sub", jwks_url=f"{base}/broker")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BENCH_ADMIN_TOKEN"] = TOKEN
        settings = load_settings(None)
        settings = replace(settings, data_dir=tmp, demo=False,
                           identity=IdentitySettings(issuers=[issuer], broker=broker),
                           server=replace(settings.server, admin_tokens=[AdminToken(
                               name="ops", token_ref="env:BENCH_ADMIN_TOKEN",
                               access="write")]))
        now = int(time.time())

        def idp(groups: list[str]) -> str:
            return jwt.encode({"iss": IDP, "aud": "console", "sub": "u1",
                               "email": "u1@example.com", "groups": groups, "iat": now,
                               "exp": now + 3600}, key, algorithm="RS256",
                              headers={"kid": "k1"})

        async with AsyncTestClient(app=create_app(settings)) as c:
            w = {"Authorization": f"Bearer {TOKEN}"}
            await c.post("/admin/v1/teams", headers=w, json={"name": "alpha"})
            made = (await c.post("/admin/v1/keys", headers=w, json={
                "team": "alpha", "user": "m@example.com"})).json()
            credential, _ = signer.issue(user="m@example.com", team="alpha",
                                         key_hash=hash_key(made["secret"]))
            team = "/admin/v1/teams/alpha"
            rows = [("admin token", team, TOKEN),
                    ("IdP token, admin", team, idp(["admins"])),
                    ("IdP token, team lead", team, idp(["leads", "alpha"])),
                    ("gateway credential, member", f"{team}/members/m@example.com",
                     credential)]
            print(f"{'bearer':<28} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/call':>12}")
            for name, path, bearer in rows:
                p50, p99, cpu = await _time(c, path, bearer, repeats)
                print(f"{name:<28} {p50:>8.2f} {p99:>8.2f} {cpu:>12.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=500)
    asyncio.run(main(parser.parse_args().repeats))
