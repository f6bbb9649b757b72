"""Brokered gateway credentials end to end: a person's OIDC token, exchanged at inferplaned,
admitted by shared-mode gateways as that person, refused when forged or revoked.

Real processes: the OIDC provider (tests/e2e/_oidc.py), inferplaned with ``identity``
configured and two ``mayu serve`` replicas on one Postgres database that trust it as
``identity.broker``; the real ``openai`` and ``anthropic`` SDKs as clients. The forged
credentials are signed here with PyJWT, with keys derived from the secrets inferplaned
signs with (gateway.identity.derive_key) or none at all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jwt
import openai
import psycopg
import pytest

from gateway.identity import derive_key
from tests.e2e._controlplane import MODEL, WRITER_TOKEN, SharedStack
from tests.e2e._identity import (
    ADMIN_TOKEN,
    DEFAULT_MEMBER_USD,
    JWKS_MAX_AGE_S,
    SECRETS,
    exchange,
    identity_stack,
    restart_inferplaned,
)
from tests.e2e._oidc import OidcProvider
from tests.e2e._procs import run_cli, wait_none_pending

pytestmark = pytest.mark.e2e

RETIRED = "retired-signing-secret-" + "r" * 24  # listed no more: its key is retired


@pytest.fixture(scope="module")
def stack(oidc: OidcProvider, pg_module_dsn: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedStack]:
    """inferplaned brokering credentials for the provider's users; three gateways."""
    yield from identity_stack(oidc, pg_module_dsn, tmp_path_factory.mktemp("identity"),
                              gateways=3)


def _credential(stack: SharedStack, oidc: OidcProvider, sub: str,
                groups: list[str], **form: str) -> str:
    r = exchange(stack, oidc.token(sub, groups=groups), **form)
    assert r.status_code == 200, r.text
    credential: str = r.json()["access_token"]
    return credential


def _status(gateway_url: str, credential: str, protocol: str) -> tuple[int, Any]:
    """One small request in ``protocol``'s shape with ``credential``: (status, body)."""
    if protocol == "openai":
        r = httpx.post(f"{gateway_url}/v1/chat/completions", timeout=30,
                       headers={"Authorization": f"Bearer {credential}"},
                       json={"model": MODEL, "max_tokens": 8,
                             "messages": [{"role": "user", "content": "hi"}]})
    else:
        r = httpx.post(f"{gateway_url}/v1/messages", timeout=30,
                       headers={"x-api-key": credential, "anthropic-version": "2023-06-01"},
                       json={"model": MODEL, "max_tokens": 8,
                             "messages": [{"role": "user", "content": "hi"}]})
    return r.status_code, r.json()


def test_the_sdks_spend_as_the_person_under_the_default_member_budget(
        stack: SharedStack, oidc: OidcProvider) -> None:
    """A credential exchanged for ada's ID token works with the openai SDK on one replica
    and the anthropic SDK on the other; /v1/me names ada under eng's default member
    budget; the request log names her; her user record keeps issuer and subject."""
    credential = _credential(stack, oidc, "ada-sub", ["eng"])
    gw0, gw1 = stack.gateways[:2]
    chat = openai.OpenAI(base_url=f"{gw0.url}/v1", api_key=credential, max_retries=0)
    assert chat.chat.completions.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]).choices
    msg = anthropic.Anthropic(base_url=gw1.url, api_key=credential, max_retries=0)
    assert msg.messages.create(model=MODEL, max_tokens=8,
                               messages=[{"role": "user", "content": "hi"}]).content
    me = httpx.get(f"{gw1.url}/v1/me", headers={"Authorization": f"Bearer {credential}"},
                   timeout=30).json()
    assert "ada-sub@example.com" in json.dumps(me) and str(DEFAULT_MEMBER_USD) in json.dumps(me)
    wait_none_pending(stack.dsn)
    with psycopg.connect(stack.dsn) as conn:
        users = conn.execute("SELECT DISTINCT k.user_name FROM permits p JOIN keys k "
                             "ON k.id = p.key_id WHERE k.brokered").fetchall()
        who = conn.execute("SELECT issuer, subject FROM users WHERE name = %s",
                           ("ada-sub@example.com",)).fetchone()
    assert users == [("ada-sub@example.com",)]
    assert who == (oidc.issuer, "ada-sub")


def test_a_person_in_several_teams_picks_one_per_credential(
        stack: SharedStack, oidc: OidcProvider) -> None:
    """Two teams: an exchange naming none is refused saying which; ``team=ml`` binds the
    credential to ml; a team not among the person's groups is refused."""
    token = oidc.token("bo-sub", groups=["eng", "ml"])
    r = exchange(stack, token)
    assert r.status_code == 400 and r.json()["error"] == "invalid_target"
    assert "eng, ml" in r.json()["error_description"]
    r = exchange(stack, token, team="ml")
    assert r.status_code == 200 and r.json()["team"] == "ml"
    assert jwt.decode(r.json()["access_token"], options={"verify_signature": False})[
        "team"] == "ml"
    assert exchange(stack, token, team="finance").json()["error"] == "invalid_target"


def test_bad_subject_tokens_are_refused_by_the_exchange(
        stack: SharedStack, oidc: OidcProvider) -> None:
    """An expired or wrongly addressed ID token, or a made-up one, gets no credential."""
    for token in (oidc.token("cy-sub", groups=["eng"], expires_in=-120),
                  oidc.token("cy-sub", groups=["eng"], aud="another-client"),
                  "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."):
        r = exchange(stack, token)
        assert r.status_code == 401 and r.json()["error"] == "invalid_grant", r.text


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _forgeries(stack: SharedStack, valid: str) -> dict[str, str]:
    """Credentials each wrong in one way, from a valid one's claims."""
    claims = jwt.decode(valid, options={"verify_signature": False})
    header, payload, signature = valid.split(".")
    now = int(time.time())
    key = derive_key(SECRETS["IPD_SIGNING_NEW"], "EdDSA")

    def signed(secret: str = SECRETS["IPD_SIGNING_NEW"], **over: Any) -> str:
        k = derive_key(secret, "EdDSA")
        return jwt.encode({**claims, **over}, k.private, algorithm="EdDSA",
                          headers={"kid": k.kid})

    public = json.dumps(key.public_jwk).encode()
    hs_input = f"{_b64({'alg': 'HS256', 'kid': key.kid})}.{payload}"
    hs_mac = hmac.new(public, hs_input.encode(), hashlib.sha256).digest()
    return {
        "expired": signed(iat=now - 7200, nbf=now - 7200, exp=now - 3600),
        "not yet valid": signed(nbf=now + 3600, iat=now + 3600, exp=now + 7200),
        "audience": signed(aud="another-gateway"),
        "issuer": signed(iss="https://evil.example.com"),
        "algorithm 'none'": f"{_b64({'alg': 'none', 'kid': key.kid})}.{payload}.",
        "algorithm 'HS256'":
            f"{hs_input}.{base64.urlsafe_b64encode(hs_mac).rstrip(b'=').decode()}",
        "unknown or retired": jwt.encode(claims, key.private, algorithm="EdDSA",
                                         headers={"kid": "made-up-kid"}),
        "signature is invalid": f"{header}.{_b64({**claims, 'team': 'ml'})}.{signature}",
        "unknown or retired ": signed(RETIRED),
    }


def test_forged_credentials_get_a_401_in_each_shape_and_nothing_is_charged(
        stack: SharedStack, oidc: OidcProvider) -> None:
    """Expired, not yet valid, wrong aud, wrong iss, alg none, HS256 keyed with the
    published key, an unknown kid, a tampered payload, a retired key: each a 401 in the
    OpenAI and in the Anthropic shape naming what failed; no permit is written."""
    valid = _credential(stack, oidc, "dee-sub", ["eng"])
    with psycopg.connect(stack.dsn) as conn:
        permits = conn.execute("SELECT count(*) FROM permits").fetchone()
    gw = stack.gateways[0]
    for what, forged in _forgeries(stack, valid).items():
        status, body = _status(gw.url, forged, "openai")
        assert status == 401 and body["error"]["code"] == "invalid_api_key", (what, body)
        assert what.strip() in body["error"]["message"], (what, body)
        status, body = _status(gw.url, forged, "anthropic")
        assert status == 401 and body["error"]["type"] == "authentication_error", what
        assert what.strip() in body["error"]["message"], (what, body)
    with psycopg.connect(stack.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM permits").fetchone() == permits
    assert _status(gw.url, valid, "openai")[0] == 200


def test_a_credential_of_the_previous_key_works_until_that_key_is_retired(
        stack: SharedStack, oidc: OidcProvider) -> None:
    """inferplaned signs with the first listed secret; a credential the second (the
    previous one) signed is accepted while its key is published. Once inferplaned runs
    without that secret (retired), the gateways refuse it within their JWKS max age,
    with no gateway restart, and the current key's credentials still work."""
    valid = _credential(stack, oidc, "eve-sub", ["eng"])
    claims = jwt.decode(valid, options={"verify_signature": False})
    old = derive_key(SECRETS["IPD_SIGNING_OLD"], "EdDSA")
    assert jwt.get_unverified_header(valid)["kid"] == derive_key(
        SECRETS["IPD_SIGNING_NEW"], "EdDSA").kid
    by_old = jwt.encode(claims, old.private, algorithm="EdDSA", headers={"kid": old.kid})
    assert _status(stack.gateways[1].url, by_old, "anthropic")[0] == 200
    restart_inferplaned(stack, signing=["IPD_SIGNING_NEW"])
    retired_at = time.monotonic()
    while (answer := _status(stack.gateways[1].url, by_old, "anthropic"))[0] == 200:
        assert time.monotonic() - retired_at < JWKS_MAX_AGE_S + 10, "retired key accepted"
        time.sleep(0.1)
    assert answer[0] == 401 and "unknown or retired" in answer[1]["error"]["message"]
    assert all(_status(g.url, valid, "openai")[0] == 200 for g in stack.gateways)


def test_the_default_member_budget_binds_a_credential_across_three_replicas(
        stack: SharedStack, oidc: OidcProvider) -> None:
    """With ml's default member budget at 1 500 µUSD a day (about one request's worst
    case), ivy's credential is served round-robin by three replicas until refused (402 or
    429 in the client's shape); what is committed for her never passes the budget."""
    limit = 1_500
    assert stack.config is not None
    done = run_cli("members", "set-default", "ml", "--usd-micros-per-day", str(limit),
                   "--config", str(stack.config), env={"INFERPLANE_DATABASE_URL": stack.dsn})
    assert done.returncode == 0, done.stderr
    credential = _credential(stack, oidc, "ivy-sub", ["ml"])
    statuses = [_status(stack.gateways[n % 3].url, credential, "openai")[0]
                for n in range(60)]
    assert statuses[0] == 200 and statuses.count(200) >= 3
    assert {s for s in statuses if s != 200} <= {402, 429} and statuses[-1] != 200
    wait_none_pending(stack.dsn)
    with psycopg.connect(stack.dsn) as conn:
        row = conn.execute("SELECT sum(usd_committed + coalesce(usd_liability, 0)), "
                           "count(DISTINCT key_id) FROM permits "
                           "WHERE user_name = 'ivy-sub@example.com'").fetchone()
    assert row is not None and 0 < row[0] <= limit and row[1] == 1


def test_a_token_of_the_idps_new_key_is_exchanged_without_a_restart(
        stack: SharedStack, oidc: OidcProvider) -> None:
    """After the IdP rotates its signing key, inferplaned exchanges a token of the new
    key (its JWKS refetched on the unknown kid, within its 1 s refresh interval) and still
    one of the old key while that stays published."""
    old_token = oidc.token("jay-sub", groups=["eng"])
    oidc.rotate()
    new_token = oidc.token("jay-sub", groups=["eng"])
    end = time.monotonic() + 10
    while (r := exchange(stack, new_token)).status_code != 200:
        assert time.monotonic() < end, r.text
        time.sleep(0.2)
    assert exchange(stack, old_token).status_code == 200


@pytest.mark.parametrize("via", ["inferplaned", "admin API"])
def test_revoking_a_user_refuses_their_credentials_on_every_replica_within_seconds(
        stack: SharedStack, oidc: OidcProvider, via: str) -> None:
    """After ``POST /v1alpha1/users/{name}/revoke`` (inferplaned, a writer token) or
    ``POST /admin/v1/users/{name}/revoke`` (a gateway's admin API) the user's credential
    is a 401 on every replica within 5 s, and a new exchange is refused."""
    sub = "fay-sub" if via == "inferplaned" else "kim-sub"
    credential = _credential(stack, oidc, sub, ["eng"])
    assert all(_status(g.url, credential, "openai")[0] == 200 for g in stack.gateways)
    assert stack.control is not None
    base, token = ((f"{stack.control.url}/v1alpha1", WRITER_TOKEN) if via == "inferplaned"
                   else (f"{stack.gateways[1].url}/admin/v1", ADMIN_TOKEN))
    r = httpx.post(f"{base}/users/{sub}@example.com/revoke",
                   headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200 and r.json()["keys_revoked"] == 1, r.text
    revoked_at = time.monotonic()
    for g in stack.gateways:
        while (status := _status(g.url, credential, "openai")[0]) == 200:
            assert time.monotonic() - revoked_at < 5.0, "still admitted 5 s after revoke"
            time.sleep(0.05)
        assert status == 401
    r = exchange(stack, oidc.token(sub, groups=["eng"]))
    assert r.status_code == 403 and r.json()["error"] == "access_denied"


def test_no_token_credential_or_secret_reaches_a_file_of_the_run(
        stack: SharedStack, oidc: OidcProvider, tmp_path: Path) -> None:
    """The logs, data dirs and audit files of every process hold none of the tokens,
    credentials and signing secrets the run used."""
    token = oidc.token("gus-sub", groups=["eng"])
    r = exchange(stack, token)
    assert r.status_code == 200
    credential = r.json()["access_token"]
    assert _status(stack.gateways[0].url, credential, "anthropic")[0] == 200
    secrets = [token, credential, *SECRETS.values(), token.split(".")[2],
               credential.split(".")[2]]
    files = [p for p in stack.workdir.rglob("*") if p.is_file()]
    files += [p for p in oidc.proc.log_path.parent.rglob("*") if p.is_file()]
    assert len(files) > 3
    for path in files:
        text = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in text, f"a secret is in {path}"
