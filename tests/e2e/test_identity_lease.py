"""Brokered credentials on the lease profile (issue 35): one credential, every plane.

inferplaned brokers credentials for the users of the tests' OIDC provider
(tests/e2e/_oidc.py) and leases three node-local planes (``mayu serve`` with SQLite
stores and ``control_plane``), each trusting inferplaned as ``identity.broker``. The
planes learn the brokered keys of their teams, and the deny list, from their heartbeat
answers (``SyncResponse.people``); a credential issued since a plane's last answer makes
that plane ask for one early heartbeat. Team ``eng`` exists in Postgres (the exchange's
team) and on each plane (with a default member budget of :data:`MEMBER_USD` per day).

The planes heartbeat every :data:`HEARTBEAT_S` seconds (``max_heartbeat_interval_s``;
no published policy sets a tighter ``renewInterval``), with :data:`ANSWER_S` as their
sync timeout. The module's setup takes about a minute on a loaded machine (the OIDC
provider's npm install, inferplaned, three planes each started and synced); each test
then takes a few seconds (it waits for heartbeats).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import psycopg
import pytest
import yaml

from tests.e2e._controlplane import serve_inferplaned
from tests.e2e._identity import EXCHANGE, ISSUER, SECRETS
from tests.e2e._lease import (
    ENV,
    MODEL,
    WRITER_TOKEN,
    LeaseStack,
    chat_status,
    refused_within_heartbeats,
)
from tests.e2e._oidc import CLIENT_ID, OidcProvider
from tests.e2e._procs import run_cli

pytestmark = pytest.mark.e2e

HEARTBEAT_S = 2.0
"""Each plane's heartbeat interval (``control_plane.max_heartbeat_interval_s``)."""
ANSWER_S = 5.0
"""Each plane's sync timeout (``control_plane.timeout_s``): a heartbeat is answered
within this, or it failed (generous: the machine running the suite is loaded, and a
credential's first request waits for one early heartbeat)."""
MEMBER_USD = 200_000
"""eng's default member budget on each plane (µUSD per day): 50,000 output tokens of
the planes' model, so a request allowing 100,000 does not fit it."""
PLANES = ("node-a", "node-b", "node-c")
TEAM = "eng"


@pytest.fixture(scope="module")
def stack(oidc: OidcProvider, pg_module_dsn: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[LeaseStack]:
    """inferplaned (identity and data-plane token) and three planes of team eng."""
    workdir = tmp_path_factory.mktemp("identity-lease")
    stack = LeaseStack(workdir=workdir, dsn=pg_module_dsn)
    try:
        _start_control(stack, oidc)
        stack.postgres_team(TEAM)  # the team a credential is exchanged for
        broker = {"issuer": ISSUER, "audience": ["mayu"], "algorithms": ["EdDSA"],
                  "user_claim": "sub", "jwks_min_refresh_s": 1.0,
                  "jwks_url": f"{stack.control_url}/v1alpha1/jwks.json"}
        for name in PLANES:
            stack.add_plane(name, teams=[TEAM], start=False, control_plane={
                "max_heartbeat_interval_s": HEARTBEAT_S, "timeout_s": ANSWER_S},
                extra={"identity": {"broker": broker}})
            done = run_cli("members", "set-default", TEAM, "--usd-micros-per-day",
                           str(MEMBER_USD), "--config", str(stack.configs[name]), env=ENV)
            assert done.returncode == 0, done.stderr
            stack.start_plane(name)
        yield stack
    finally:
        stack.stop()


def _start_control(stack: LeaseStack, oidc: OidcProvider) -> None:
    config = stack.workdir / "inferplaned.yaml"
    config.write_text(yaml.safe_dump({
        "database": {"dsn_ref": "env:IPD_DSN", "pool_min_size": 1, "pool_max_size": 4},
        "auth": {"writer_tokens_ref": {"e2e": "env:IPD_TOKEN"},
                 "dataplane_tokens_ref": {"nodes": "env:MAYU_CP_TOKEN"}},
        "identity": {
            "issuers": [{"issuer": oidc.issuer, "audience": [CLIENT_ID],
                         "jwks_min_refresh_s": 1.0}],
            "credentials": {"issuer": ISSUER, "lifetime_s": 600,
                            "signing_keys_ref": [f"env:{n}" for n in SECRETS]}}}))
    stack.control = serve_inferplaned(
        config, port=stack.port, log_path=stack.workdir / "inferplaned.log",
        env={"IPD_DSN": stack.dsn, **ENV, **SECRETS})


def _exchange(stack: LeaseStack, token: str) -> str:
    r = httpx.post(f"{stack.control_url}/v1alpha1/token",
                   data={**EXCHANGE, "subject_token": token}, timeout=30)
    assert r.status_code == 200, r.text
    credential: str = r.json()["access_token"]
    return credential


def _permits(stack: LeaseStack, plane: str) -> int:
    """Permits in the plane's own SQLite file (every admitted request writes one)."""
    data_dir = yaml.safe_load(stack.configs[plane].read_text())["data_dir"]
    with sqlite3.connect(f"{data_dir}/mayu.db") as conn:
        return int(conn.execute("SELECT count(*) FROM gov_permits").fetchone()[0])


def _held(stack: LeaseStack, plane: str, user: str) -> list[tuple[str, str | None]]:
    """The brokered keys of ``user`` the plane holds: (key hash, revoked at)."""
    data_dir = yaml.safe_load(stack.configs[plane].read_text())["data_dir"]
    with sqlite3.connect(f"{data_dir}/mayu.db") as conn:
        return conn.execute("SELECT key_hash, revoked_at FROM keys WHERE user = ? AND "
                            "display_prefix = 'brokered'", (user,)).fetchall()


def _openai(url: str, credential: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=credential, max_retries=0)


def _anthropic(url: str, credential: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=credential, max_retries=0)


def test_one_credential_works_on_three_planes_as_the_person_under_the_member_budget(
        stack: LeaseStack, oidc: OidcProvider) -> None:
    """A credential exchanged once (for a person signing in the first time) works at once
    on each of the three planes with the openai and the anthropic SDK; each plane
    admits it as ada in eng (``/v1/me``: her user, eng's default member budget), a
    request beyond that member budget is refused 402 with nothing charged, and each
    plane's usage log names ada."""
    credential = _exchange(stack, oidc.token("ada-sub", groups=[TEAM]))
    user = "ada-sub@example.com"  # the issuer's user claim: email
    for name in PLANES:
        url = stack.planes[name].url
        chat = _openai(url, credential).chat.completions.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert chat.choices, name
        msg = _anthropic(url, credential).messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert msg.content, name
        me = httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {credential}"},
                       timeout=30)
        assert me.status_code == 200, me.text
        text = json.dumps(me.json())
        assert f'"{user}"' in text and str(MEMBER_USD) in text, (name, text)
        before = _permits(stack, name)
        with pytest.raises(openai.APIStatusError) as refused:
            _openai(url, credential).chat.completions.create(
                model=MODEL, max_tokens=100_000, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.status_code == 402, (name, refused.value.body)
        assert "member" in json.dumps(refused.value.body), (name, refused.value.body)
        assert _permits(stack, name) == before, name
        usage = httpx.get(f"{url}/admin/v1/requests", timeout=30,
                          headers={"Authorization": f"Bearer {ENV['MAYU_ADMIN_TOKEN']}"})
        assert usage.status_code == 200, usage.text
        assert json.dumps(usage.json()).count(f'"{user}"') >= 2, (name, usage.text[:2000])
        # Only the key's hash reached the plane: no secret of it exists anywhere.
        assert [revoked for _, revoked in _held(stack, name, user)] == [None], name


def test_revoking_the_user_refuses_the_credential_on_all_three_planes_within_one_heartbeat(
        stack: LeaseStack, oidc: OidcProvider) -> None:
    """Every plane admits bo's credential; after inferplaned's
    ``POST /v1alpha1/users/{name}/revoke`` each plane refuses it from the first
    heartbeat answer after the revoke. Counted at inferplaned (the planes' heartbeats,
    independent of the machine's load): at most two heartbeats of a plane land between
    the revoke's answer and just after its first 401 (the one in flight at the revoke,
    whose answer may predate it, and the next, which carries the deny list). Timed: each
    plane's delay from the revoke's answer to its first 401 is printed and stays within
    one interval plus those two round trips (``HEARTBEAT_S + 2 * ANSWER_S``). The refusal
    is a 401 in the OpenAI and in the Anthropic shape, and nothing is charged for it."""
    credential = _exchange(stack, oidc.token("bo-sub", groups=[TEAM]))
    with httpx.Client() as client:
        for name in PLANES:
            status = chat_status(stack.planes[name].url, credential, client)
            assert status == 200, name
    r = httpx.post(f"{stack.control_url}/v1alpha1/users/bo-sub@example.com/revoke",
                   timeout=30, headers={"Authorization": f"Bearer {WRITER_TOKEN}"})
    assert r.status_code == 200 and r.json()["keys_revoked"] == 1, r.text
    revoked = time.monotonic()
    refused_within_heartbeats(stack, PLANES, credential, meanwhile=(200,), revoked=revoked,
                              heartbeat_s=HEARTBEAT_S, answer_s=ANSWER_S)
    for name in PLANES:
        url = stack.planes[name].url
        before = _permits(stack, name)
        with pytest.raises(openai.AuthenticationError) as oai:
            _openai(url, credential).chat.completions.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert oai.value.status_code == 401 and isinstance(oai.value.body, dict), name
        assert oai.value.body.get("code") == "invalid_api_key", (name, oai.value.body)
        with pytest.raises(anthropic.AuthenticationError) as ant:
            _anthropic(url, credential).messages.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        body: Any = ant.value.body
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
        assert _permits(stack, name) == before, name
        # The plane holds the key revoked at inferplaned's revocation time.
        held = _held(stack, name, "bo-sub@example.com")
        assert [at is not None for _, at in held] == [True], name
    with psycopg.connect(stack.dsn) as conn:
        at = conn.execute("SELECT revoked_at FROM users WHERE name = %s",
                          ("bo-sub@example.com",)).fetchone()
    assert at is not None and at[0] is not None


def test_no_token_or_credential_reaches_a_file_of_any_plane_or_inferplaned(
        stack: LeaseStack, oidc: OidcProvider) -> None:
    """The data dirs (SQLite files), logs and audit files of the three planes and
    inferplaned's log hold none of the IdP tokens, credentials and signing secrets used."""
    token = oidc.token("cy-sub", groups=[TEAM])
    credential = _exchange(stack, token)
    with httpx.Client() as client:
        for name in PLANES:
            status = chat_status(stack.planes[name].url, credential, client)
            assert status == 200, name
    secrets = [token, credential, *SECRETS.values(), token.split(".")[2],
               credential.split(".")[2]]
    files = [p for p in stack.workdir.rglob("*") if p.is_file()]
    assert sum(1 for p in files if p.name.endswith(".db")) >= 3, files
    assert any(p.name.endswith(".log") for p in files), files
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"a secret is in {path}"


def test_a_plane_holds_no_key_of_another_team_until_it_has_the_team(
        stack: LeaseStack, oidc: OidcProvider) -> None:
    """A person of team ml (in Postgres, on no plane) gets a credential: no plane holds
    a key of it, and each refuses it 401. Once node-a has team ml, the person's next
    credential works there at its first request (the plane re-reads its teams for the
    early heartbeat that request asks for), and still on node-a only."""
    stack.postgres_team("ml")
    credential = _exchange(stack, oidc.token("di-sub", groups=["ml"]))
    with httpx.Client() as client:
        for name in PLANES:
            status = chat_status(stack.planes[name].url, credential, client)
            assert status == 401, name
            assert _held(stack, name, "di-sub@example.com") == [], name
        done = run_cli("teams", "create", "ml", "--config", str(stack.configs["node-a"]),
                       env=ENV)
        assert done.returncode == 0, done.stderr
        again = _exchange(stack, oidc.token("di-sub", groups=["ml"]))
        status = chat_status(stack.planes["node-a"].url, again, client)
        assert status == 200
        status = chat_status(stack.planes["node-b"].url, again, client)
        assert status == 401
    assert [at for _, at in _held(stack, "node-a", "di-sub@example.com")] == [None]
