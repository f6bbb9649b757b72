"""inferplaned's ``POST /v1alpha1/credentials`` in process (Litestar test client, a real
migrated Postgres) against moto's STS as a real server (a thread of this process): who
gets a session and who does not, what a session is named, what the STS's failure looks
like, and what the config refuses. The three-plane run is tests/e2e/test_bedrock_lease.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import botocore.session
import pytest
from litestar.testing import AsyncTestClient
from moto.server import ThreadedMotoServer

from controlplane import create_app
from controlplane.credentials import CredentialBroker
from controlplane.settings import (
    AuthSettings,
    BrokeredCredential,
    ControlPlaneConfig,
    DataPlaneToken,
)
from gateway.config import AwsCredentials, DatabaseSettings
from gateway.errors import ConfigError
from tests.e2e._procs import free_port

pytestmark = pytest.mark.integration

BASE = ("AKIDBROKERBASE001", "broker-base-secret-0123456789abcdef")
ROLE = "arn:aws:iam::123456789012:role/inferplane-bedrock"
TOKENS = {"scoped": "s" * 24, "unscoped": "u" * 24, "writer": "w" * 24}


@pytest.fixture(scope="module")
def sts_url() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _aws(sts_url: str, **over: Any) -> AwsCredentials:
    fields: dict[str, Any] = {
        "region": "us-east-1", "role_arn": ROLE, "access_key_id_ref": "env:IPD_CB_AK",
        "secret_access_key_ref": "env:IPD_CB_SK", "duration_s": 900,
        "session_tags": {"cost-center": "42"}, "sts_endpoint_url": sts_url, **over}
    return AwsCredentials(**fields)


@pytest.fixture
async def client(pg_dsn: str, sts_url: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[AsyncTestClient[Any]]:
    monkeypatch.setenv("IPD_CB_DSN", pg_dsn)
    monkeypatch.setenv("IPD_CB_AK", BASE[0])
    monkeypatch.setenv("IPD_CB_SK", BASE[1])
    for name, token in TOKENS.items():
        monkeypatch.setenv(f"IPD_CB_{name.upper()}", token)
    config = ControlPlaneConfig(
        database=DatabaseSettings(dsn_ref="env:IPD_CB_DSN", pool_min_size=1,
                                  pool_max_size=2),
        auth=AuthSettings(
            writer_tokens_ref={"writer": "env:IPD_CB_WRITER"},
            dataplane_tokens_ref={
                "scoped": DataPlaneToken(token_ref="env:IPD_CB_SCOPED",
                                         planes=["node-*"], teams=["ml", "ops team"]),
                "unscoped": "env:IPD_CB_UNSCOPED"}),
        credentials={
            "bedrock": BrokeredCredential(aws=_aws(sts_url)),
            "finance-only": BrokeredCredential(aws=_aws(sts_url), teams=["finance"]),
            "no-sts": BrokeredCredential(aws=_aws(
                sts_url, sts_endpoint_url=f"http://127.0.0.1:{free_port()}"))})
    async with AsyncTestClient(app=create_app(config)) as c:
        yield c


async def _ask(client: AsyncTestClient[Any], token: str, **body: Any) -> Any:
    return await client.post("/v1alpha1/credentials", json=body,
                             headers={"Authorization": f"Bearer {token}"})


async def test_a_session_for_a_served_team_signs_as_that_team_and_plane(
        client: AsyncTestClient[Any], sts_url: str) -> None:
    """The answer is an STS session moto accepts (GetCallerIdentity signed with it names
    the assumed role and the session ``inferplane-<team>@<plane>``, unsafe characters
    replaced), expiring in the configured duration, never cached by a proxy."""
    r = await _ask(client, TOKENS["scoped"], credential="bedrock", team="ops team",
                   dataplane_id="node-7")
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    got = r.json()
    assert got["session_name"] == "inferplane-ops_team@node-7"
    assert got["access_key_id"] != BASE[0] and got["secret_access_key"] != BASE[1]
    sts: Any = botocore.session.Session().create_client(
        "sts", endpoint_url=sts_url, region_name="us-east-1",
        aws_access_key_id=got["access_key_id"],
        aws_secret_access_key=got["secret_access_key"],
        aws_session_token=got["session_token"])
    assert sts.get_caller_identity()["Arn"].endswith(
        "assumed-role/inferplane-bedrock/inferplane-ops_team@node-7")
    left = (datetime.fromisoformat(got["expiration"]) - datetime.now(UTC)).total_seconds()
    assert 800 < left <= 900
    # Without a plane id the token's name stands for the plane.
    r = await _ask(client, TOKENS["scoped"], credential="bedrock", team="ml")
    assert r.status_code == 200 and r.json()["session_name"] == "inferplane-ml@scoped"


async def test_who_gets_nothing(client: AsyncTestClient[Any]) -> None:
    """A team the token does not serve, a plane outside its planes, a token bound to no
    team, a credential not for the team, a writer token, no token, an unknown
    credential, a bad body: each refused in inferplaned's error shape, no credential in
    any answer."""
    cases = {
        "foreign team": (TOKENS["scoped"], {"credential": "bedrock", "team": "finance"}),
        "foreign plane": (TOKENS["scoped"], {"credential": "bedrock", "team": "ml",
                                             "dataplane_id": "other-1"}),
        "unscoped token": (TOKENS["unscoped"], {"credential": "bedrock", "team": "ml"}),
        "credential's teams": (TOKENS["scoped"], {"credential": "finance-only",
                                                  "team": "ml"}),
        "writer": (TOKENS["writer"], {"credential": "bedrock", "team": "ml"}),
        "no token": ("", {"credential": "bedrock", "team": "ml"}),
        "unknown credential": (TOKENS["scoped"], {"credential": "vertex", "team": "ml"}),
        "extra field": (TOKENS["scoped"], {"credential": "bedrock", "team": "ml",
                                           "role_arn": ROLE}),
        "no team": (TOKENS["scoped"], {"credential": "bedrock"})}
    statuses = {}
    for why, (token, body) in cases.items():
        r = await _ask(client, token, **body)
        statuses[why] = r.status_code
        assert set(r.json()) == {"error"}, why
    assert statuses == {"foreign team": 403, "foreign plane": 403, "unscoped token": 403,
                        "credential's teams": 403, "writer": 403, "no token": 401,
                        "unknown credential": 404, "extra field": 400, "no team": 400}


async def test_an_sts_that_does_not_answer_is_a_502_without_a_secret(
        client: AsyncTestClient[Any], caplog: pytest.LogCaptureFixture) -> None:
    r = await _ask(client, TOKENS["scoped"], credential="no-sts", team="ml")
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert "the STS did not issue a session" in message
    assert BASE[1] not in message and BASE[1] not in caplog.text


def test_the_config_refuses_a_credential_that_is_not_a_role(sts_url: str,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """inferplaned hands out sessions of a role, never its own keys; a bad reference
    fails at start naming its key."""
    with pytest.raises(ConfigError, match=r"credentials\.x\.aws\.role_arn: required"):
        CredentialBroker({"x": BrokeredCredential(aws=_aws(sts_url, role_arn=None))})
    monkeypatch.delenv("IPD_CB_SK", raising=False)
    monkeypatch.setenv("IPD_CB_AK", BASE[0])
    with pytest.raises(ConfigError, match=r"credentials\.x\.aws\.secret_access_key_ref"):
        CredentialBroker({"x": BrokeredCredential(aws=_aws(sts_url))})
