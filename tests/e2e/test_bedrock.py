"""The ``bedrock`` provider kind and the Bedrock ingress against a strict Bedrock peer.

One module-scoped stack: ``tests/e2e/_bedrock_peer.py`` (SigV4 checked with botocore
against the credentials it issued, the AWS event-stream framing, moto's STS in the same
process), ``mayu mock-upstream`` as an ``anthropic`` deployment, and ``mayu serve`` with
bedrock providers on static keys, on an STS role with a 20 s session, on a wrong secret
and on an STS that does not answer. Money is checked against the peer's own ledger.
Real Claude Code (``claude`` from ``test_refine_claude_code``: the pinned npm package)
runs a tool loop in its Bedrock gateway mode.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import boto3
import httpx
import pytest
import yaml
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from tests.e2e._procs import (
    Proc,
    free_port,
    run_cli,
    start_bedrock_peer,
    start_gateway,
    start_mock_upstream,
)
from tests.e2e.conftest import ADMIN_TOKEN, PRICE, Stack, cut_stream, expected_cost
from tests.e2e.test_refine_claude_code import claude  # noqa: F401 (the installed agent)

pytestmark = pytest.mark.e2e

REGION = "us-east-1"
STATIC = ("AKIDBEDROCKPEER01", "peer-static-secret-0123456789abcdef")
BASE = ("AKIDSTSBASE000001", "sts-base-secret-0123456789abcdef")
ROLE = "arn:aws:iam::123456789012:role/inferplane-bedrock"
SESSION_S = 20
WEB_TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLTAxMjM0NQ"
MOCK_ID = "us.anthropic.claude-mock-v1:0"
SONNET_ID = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
"""Claude Code 2.1.197's default model in Bedrock mode (recorded by running it)."""
SYSTEM = [{"type": "text", "text": "You are terse. " * 40, "cache_control": {"type": "ephemeral"}}]
HI = {"max_tokens": 40, "messages": [{"role": "user", "content": "tell me a story"}]}


@dataclass
class Bedrock:
    stack: Stack
    peer: Proc
    sts_url: str

    def ledger(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = httpx.get(f"{self.peer.url}/__peer/ledger").json()
        return entries

    def refusals(self) -> list[dict[str, str]]:
        kinds: list[dict[str, str]] = httpx.get(f"{self.peer.url}/__peer/refusals").json()
        return kinds

    def settled(self, key: str) -> dict[str, Any]:
        """The key's team-day usage once nothing is reserved."""
        end = time.monotonic() + 60
        while time.monotonic() < end:
            usage = self.stack.team_usage(key)
            if not usage["usd_reserved"] and not usage["tokens_reserved"]:
                return usage
            time.sleep(0.05)
        raise AssertionError(f"still reserved: {self.stack.team_usage(key)}")


def start_peer(workdir: Path) -> tuple[Proc, str]:
    """The Bedrock peer (and its STS) as a process; (proc, STS URL)."""
    return start_bedrock_peer(workdir, "--key", ":".join(STATIC), region=REGION)


def config(workdir: Path, peer: Proc, sts_url: str, upstream: Proc) -> Path:
    aws = {"kind": "aws", "region": REGION}
    token = workdir / "web-identity-token"  # what EKS mounts; moto does not verify it
    token.write_text(WEB_TOKEN)
    static = {**aws, "access_key_id_ref": "env:BEDROCK_AK",
              "secret_access_key_ref": "env:BEDROCK_SK"}
    role = {**aws, "access_key_id_ref": "env:STS_BASE_AK",
            "secret_access_key_ref": "env:STS_BASE_SK", "role_arn": ROLE,
            "external_id": "inferplane-e2e", "session_name": "inferplane-team-a",
            "duration_s": SESSION_S, "session_tags": {"team": "a"},
            "sts_endpoint_url": sts_url}
    providers = [
        {"name": "aws", "kind": "bedrock", "base_url": peer.url, "credentials": static,
         "timeout_s": 60},
        {"name": "aws-role", "kind": "bedrock", "base_url": peer.url, "credentials": role,
         "timeout_s": 60},
        {"name": "aws-wrong", "kind": "bedrock", "base_url": peer.url,
         "credentials": {**static, "secret_access_key_ref": "env:WRONG_SK",
                         "session_token_ref": "env:WRONG_TOKEN"}},
        {"name": "aws-nosts", "kind": "bedrock", "base_url": peer.url,
         "credentials": {**role, "sts_endpoint_url": f"http://127.0.0.1:{free_port()}"}},
        {"name": "aws-webid", "kind": "bedrock", "base_url": peer.url, "credentials": {
            **aws, "web_identity_token_file": str(token), "role_arn": ROLE,
            "session_name": "inferplane-webid", "sts_endpoint_url": sts_url}},
        {"name": "up-anthropic", "kind": "anthropic", "base_url": upstream.url}]
    deployments = {"claude-bedrock": ("aws", MOCK_ID),
                   "claude-role": ("aws-role", MOCK_ID),
                   "claude-webid": ("aws-webid", MOCK_ID),
                   "claude-role-long": ("aws-role", "us.anthropic.claude-drawn-out-v1:0"),
                   "claude-throttle": ("aws", "us.anthropic.claude-throttle-v1:0"),
                   "claude-cut": ("aws", "us.anthropic.claude-cut-stream-v1:0"),
                   "claude-exception": ("aws", "us.anthropic.claude-stream-exception-v1:0"),
                   "claude-wrong": ("aws-wrong", MOCK_ID),
                   "claude-nosts": ("aws-nosts", MOCK_ID),
                   "claude-anthropic": ("up-anthropic", "mock-claude"),
                   "claude-sonnet-4-5": ("aws-role", SONNET_ID)}
    models = [{"name": name, "price": PRICE, "max_input_tokens": 200_000,
               **({"max_output_tokens": 64_000} if name == "claude-sonnet-4-5" else {}),
               "deployments": [{"provider": p, "upstream_model": m}]}
              for name, (p, m) in deployments.items()]
    # Its input bound refined by Bedrock's CountTokens before every admission.
    models.append({"name": "claude-counted", "price": PRICE, "max_input_tokens": 200_000,
                   "refine_input": "always",
                   "deployments": [{"provider": "aws", "upstream_model": MOCK_ID}]})
    # A Bedrock deployment that falls back to another when its credentials are missing.
    models.append({"name": "claude-nosts-fallback", "price": PRICE,
                   "max_input_tokens": 200_000, "deployments": [
                       {"provider": "aws-nosts", "upstream_model": MOCK_ID},
                       {"provider": "aws", "upstream_model": MOCK_ID}]})
    doc = {"data_dir": str(workdir / "data"), "demo": False,
           "server": {"admin_token_ref": "env:MAYU_E2E_ADMIN_TOKEN",
                      "max_body_bytes": 1 << 20},  # Claude Code's turns are ~90 KB
           "providers": providers, "models": models}
    path = workdir / "mayu.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


ENV = {"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN, "BEDROCK_AK": STATIC[0],
       "BEDROCK_SK": STATIC[1], "STS_BASE_AK": BASE[0], "STS_BASE_SK": BASE[1],
       "WRONG_SK": "not-the-peer-secret-at-all-0000",
       "WRONG_TOKEN": "session-token-the-peer-quotes-back-0123456789"}


@pytest.fixture(scope="module")
def bedrock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bedrock]:
    workdir = tmp_path_factory.mktemp("bedrock")
    peer, sts_url = start_peer(workdir)
    upstream = gateway = None
    try:
        upstream = start_mock_upstream(workdir)
        path = config(workdir, peer, sts_url, upstream)
        gateway = start_gateway(path, env=ENV)
        yield Bedrock(Stack(gateway=gateway, upstream=upstream, config=path), peer, sts_url)
    finally:
        for proc in (gateway, upstream, peer):
            if proc is not None:
                proc.stop()


def _bedrock_client(b: Bedrock, key: str) -> anthropic.AnthropicBedrock:
    """The SDK's Bedrock client at the gateway; our key in ``x-api-key`` (the SDK still
    SigV4-signs with whatever AWS keys it has: the gateway ignores that header)."""
    return anthropic.AnthropicBedrock(
        base_url=f"{b.stack.gateway.url}/bedrock", aws_region=REGION,
        aws_access_key="AKIDCLIENTSIDE", aws_secret_key="client-side-unused",
        default_headers={"x-api-key": key}, max_retries=0)


def test_messages_to_bedrock_commit_the_peers_record(bedrock: Bedrock) -> None:
    """/v1/messages served by a bedrock deployment, JSON and streamed with cache classes:
    committed equals the peer's own ledger priced, to the µUSD; betas reach the body."""
    key = bedrock.stack.team_key("bedrock-messages")
    client = anthropic.Anthropic(base_url=bedrock.stack.gateway.url, api_key=key,
                                 max_retries=0)
    httpx.delete(f"{bedrock.peer.url}/__peer/ledger")
    answer = client.messages.create(model="claude-bedrock", system=SYSTEM, **HI,
                                    extra_headers={"anthropic-beta": "beta-one"})
    assert answer.content[0].type == "text" and answer.usage.cache_read_input_tokens > 0
    with client.messages.stream(model="claude-bedrock", system=SYSTEM, **HI) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens")
    ledger = bedrock.ledger()
    assert [e["stream"] for e in ledger] == [False, True]
    assert ledger[0]["anthropic_beta"] == ["beta-one"]
    assert all(e["classes"]["cache_write_5m"] > 0 for e in ledger)
    usage = bedrock.settled(key)
    assert usage["usd_committed"] == sum(expected_cost(e) for e in ledger)
    assert usage["usd_liability"] == 0


def test_bedrock_sdk_through_the_gateway_both_ways(bedrock: Bedrock) -> None:
    """AnthropicBedrock at /bedrock works against a bedrock deployment (its inference
    profile id or our model name) and an anthropic one, JSON and streamed, settled exactly."""
    key = bedrock.stack.team_key("bedrock-sdk")
    client = _bedrock_client(bedrock, key)
    httpx.delete(f"{bedrock.peer.url}/__peer/ledger")
    bedrock.stack.clear_ledger()
    for model in (MOCK_ID, "claude-anthropic"):
        answer = client.messages.create(model=model, **HI)
        assert answer.content[0].type == "text"
        with client.messages.stream(model=model, **HI) as stream:
            text = "".join(stream.text_stream)
        assert text and stream.get_final_message().usage.output_tokens > 0
    ledgers = bedrock.ledger() + bedrock.stack.ledger()
    assert len(ledgers) == 4
    usage = bedrock.settled(key)
    assert usage["usd_committed"] == sum(expected_cost(e) for e in ledgers)
    assert usage["usd_liability"] == 0


def test_count_tokens_refines_a_bedrock_input_bound(bedrock: Bedrock) -> None:
    """refine_input: always on a bedrock deployment asks Bedrock's CountTokens (for the
    foundation model, not the profile): the input bound is the count plus its allowance,
    below the byte bound of the same request; the answer settles exactly."""
    key = bedrock.stack.team_key("bedrock-counted")
    httpx.delete(f"{bedrock.peer.url}/__peer/ledger")
    before = httpx.get(f"{bedrock.peer.url}/__peer/counts").json()["counts"]
    bounds = {}
    for model in ("claude-counted", "claude-bedrock"):
        r = httpx.post(f"{bedrock.stack.gateway.url}/v1/messages", timeout=60,
                       json={"model": model, "system": SYSTEM, **HI},
                       headers={"x-api-key": key})
        assert r.status_code == 200, r.text
        bounds[model] = int(r.headers["x-inferplane-token-bound"])
    assert httpx.get(f"{bedrock.peer.url}/__peer/counts").json()["counts"] == before + 1
    assert bounds["claude-counted"] < bounds["claude-bedrock"]
    usage = bedrock.settled(key)
    assert usage["usd_committed"] == sum(expected_cost(e) for e in bedrock.ledger())


def test_bedrock_errors_keep_the_clients_shape_and_retryability(bedrock: Bedrock) -> None:
    """Throttling is a 429 rate_limit_error to an Anthropic client and a 429
    ThrottlingException to a Bedrock one; nothing is charged; an unknown model id is a
    404 in Bedrock's shape."""
    key = bedrock.stack.team_key("bedrock-errors")
    client = anthropic.Anthropic(base_url=bedrock.stack.gateway.url, api_key=key,
                                 max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as err:
        client.messages.create(model="claude-throttle", **HI)
    assert "ThrottlingException" in str(err.value)
    raw = httpx.post(f"{bedrock.stack.gateway.url}/bedrock/model/claude-throttle/invoke",
                     json={"anthropic_version": "bedrock-2023-05-31", **HI},
                     headers={"x-api-key": key})
    assert raw.status_code == 429 and raw.headers["x-amzn-errortype"] == "ThrottlingException"
    assert "ThrottlingException" in raw.json()["message"]
    missing = httpx.post(f"{bedrock.stack.gateway.url}/bedrock/model/nope-v1:0/invoke",
                         json=HI, headers={"x-api-key": key})
    assert missing.status_code == 404
    assert missing.headers["x-amzn-errortype"] == "ResourceNotFoundException"
    assert "nope-v1:0" in missing.json()["message"]
    no_key = httpx.post(f"{bedrock.stack.gateway.url}/bedrock/model/claude-bedrock/invoke",
                        json=HI, headers={"authorization": "AWS4-HMAC-SHA256 Credential=x"})
    assert no_key.status_code == 401
    usage = bedrock.settled(key)
    assert usage["usd_committed"] == usage["usd_liability"] == 0


def test_peer_refuses_wrong_signatures_and_the_client_pays_nothing(bedrock: Bedrock) -> None:
    """A deployment signing with a wrong secret is refused by the peer (403
    InvalidSignatureException, quoting the canonical request as AWS does): the client
    gets a 500 naming the refusal and nothing of the quote, nothing is charged. A
    tampered body fails the peer's SigV4 check too."""
    key = bedrock.stack.team_key("bedrock-wrong")
    client = anthropic.Anthropic(base_url=bedrock.stack.gateway.url, api_key=key,
                                 max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.create(model="claude-wrong", **HI)
    assert err.value.status_code == 500 and "InvalidSignatureException" in str(err.value)
    # The peer quotes its canonical request, session token included, as AWS does: none
    # of it reaches the client (nor the audit and log: the last test greps them).
    assert ENV["WRONG_TOKEN"] not in err.value.response.text
    assert bedrock.refusals()[-1]["kind"] == "InvalidSignatureException"
    usage = bedrock.settled(key)
    assert usage["usd_committed"] == usage["usd_liability"] == 0
    body = b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"messages":[]}'
    url = f"{bedrock.peer.url}/model/{MOCK_ID.replace(':', '%3A')}/invoke"
    request = AWSRequest(method="POST", url=url, data=body,
                         headers={"content-type": "application/json"})
    SigV4Auth(Credentials(*STATIC), "bedrock", REGION).add_auth(request)
    signed = dict(request.headers.items())
    assert httpx.post(url, content=body, headers=signed).status_code == 200
    tampered = httpx.post(url, content=body.replace(b"5", b"6"), headers=signed)
    assert tampered.status_code == 403
    assert tampered.headers["x-amzn-errortype"].startswith("InvalidSignatureException")


def test_web_identity_role_signs_the_calls(bedrock: Bedrock) -> None:
    """web_identity_token_file + role_arn: AssumeRoleWithWebIdentity (unsigned, the
    token is the proof) gives the session the peer accepts, named as configured."""
    key = bedrock.stack.team_key("bedrock-webid")
    client = anthropic.Anthropic(base_url=bedrock.stack.gateway.url, api_key=key,
                                 max_retries=0)
    httpx.delete(f"{bedrock.peer.url}/__peer/ledger")
    assert client.messages.create(model="claude-webid", **HI).content
    assert [e["session"] for e in bedrock.ledger()] == ["inferplane-webid"]


def test_peer_refuses_an_expired_session(bedrock: Bedrock) -> None:
    """A session moto issued is accepted until its expiry and a 403 ExpiredTokenException
    after it: the peer is as strict as Bedrock about lapsed credentials."""
    sts = boto3.client("sts", endpoint_url=bedrock.sts_url, region_name=REGION,
                       aws_access_key_id=BASE[0], aws_secret_access_key=BASE[1],
                       config=Config(parameter_validation=False))  # a 2 s session
    issued = sts.assume_role(RoleArn=ROLE, RoleSessionName="short",
                             DurationSeconds=2)["Credentials"]
    creds = Credentials(issued["AccessKeyId"], issued["SecretAccessKey"],
                        issued["SessionToken"])
    body = b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"messages":[]}'
    url = f"{bedrock.peer.url}/model/{MOCK_ID.replace(':', '%3A')}/invoke"

    def call() -> httpx.Response:
        request = AWSRequest(method="POST", url=url, data=body,
                             headers={"content-type": "application/json"})
        SigV4Auth(creds, "bedrock", REGION).add_auth(request)
        return httpx.post(url, content=body, headers=dict(request.headers.items()))
    assert call().status_code == 200
    time.sleep(max(0.0, (issued["Expiration"] - datetime.datetime.now(datetime.UTC))
                   .total_seconds()) + 0.5)
    expired = call()
    assert expired.status_code == 403
    assert expired.headers["x-amzn-errortype"].startswith("ExpiredTokenException")


def test_sts_session_expiring_mid_run_fails_no_request(bedrock: Bedrock) -> None:
    """With a 20 s STS session, requests for 45 s never fail: the role is assumed again
    before expiry, off the request path; a stream longer than a session completes; each
    call names the configured session (what CloudTrail shows). ~45 s: two sessions must
    expire under load, and a session shorter than 20 s leaves no room to refresh early."""
    key = bedrock.stack.team_key("bedrock-sts")
    client = anthropic.Anthropic(base_url=bedrock.stack.gateway.url, api_key=key,
                                 max_retries=0)
    httpx.delete(f"{bedrock.peer.url}/__peer/ledger")
    long: dict[str, Any] = {}

    def stream_long() -> None:
        started = time.monotonic()
        with client.messages.stream(model="claude-role-long", **HI) as stream:
            long["message"] = stream.get_final_message()
        long["took_s"] = time.monotonic() - started

    runner = threading.Thread(target=stream_long)
    runner.start()
    failures, done = [], 0
    end = time.monotonic() + 45
    while time.monotonic() < end:
        try:
            client.messages.create(model="claude-role", **HI)
            done += 1
        except anthropic.APIError as exc:
            failures.append(repr(exc))
        time.sleep(0.5)
    runner.join(timeout=60)
    assert failures == [] and done >= 30
    assert long["message"].stop_reason in ("end_turn", "max_tokens")
    assert long["took_s"] > SESSION_S  # it outlived the credential that signed it
    ledger = bedrock.ledger()
    assert {e["session"] for e in ledger} == {"inferplane-team-a"}
    assert len({e["key_id"] for e in ledger}) >= 3  # 45 s of 20 s sessions
    assert not [r for r in bedrock.refusals() if r["kind"] == "ExpiredTokenException"]
    usage = bedrock.settled(key)
    assert usage["usd_committed"] == sum(expected_cost(e) for e in ledger)


def test_missing_credentials_are_a_503_of_that_deployment_only(bedrock: Bedrock) -> None:
    """A provider whose STS never answers: its requests are a 503 naming the cause's
    place (nothing sent, nothing charged), its fallback serves, other deployments are
    untouched; the cause is in the log and the failures are counted."""
    key = bedrock.stack.team_key("bedrock-nosts")
    client = anthropic.Anthropic(base_url=bedrock.stack.gateway.url, api_key=key,
                                 max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as err:
        client.messages.create(model="claude-nosts", **HI)
    assert err.value.status_code == 503
    assert "aws-nosts: its cloud credentials are unavailable" in str(err.value)
    assert client.messages.create(model="claude-nosts-fallback", **HI).content
    assert client.messages.create(model="claude-bedrock", **HI).content
    gateway = bedrock.stack.gateway
    assert "credential refresh failed for provider aws-nosts" in gateway.logs()
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'mayu_credential_refresh_failures_total{provider="aws-nosts"}' in metrics
    usage = bedrock.settled(key)
    assert usage["usd_liability"] == 0


@pytest.mark.parametrize("model", ["claude-cut", "claude-exception"])
def test_cut_bedrock_streams_keep_the_three_figures(bedrock: Bedrock, model: str) -> None:
    """A Bedrock stream broken mid-way (the connection, or an exception message) reaches
    the client as an error event in either framing; what arrived commits, the rest of
    the bound is liability, nothing stays reserved."""
    for route in ("messages", "bedrock"):
        key = bedrock.stack.team_key(f"cut-{model}-{route}")
        if route == "messages":
            url, body = f"{bedrock.stack.gateway.url}/v1/messages", {
                "model": model, "stream": True, **HI}
        else:
            url, body = (f"{bedrock.stack.gateway.url}/bedrock/model/{model}/"
                         "invoke-with-response-stream", HI)
        bound, text = cut_stream(url, body, {"x-api-key": key})
        marker = b"event: error" if route == "messages" else b"modelStreamErrorException"
        assert marker in text
        usage = bedrock.settled(key)
        assert usage["usd_committed"] + usage["usd_liability"] == bound
        assert 0 < usage["usd_committed"] < bound


def test_client_leaving_a_bedrock_stream_keeps_the_three_figures(bedrock: Bedrock) -> None:
    """A Bedrock-framed client that hangs up after the first event-stream message: the
    attempt settles uncertain, committed what was observed and the rest of the bound
    liability; nothing stays reserved and the peer never reported usage."""
    key = bedrock.stack.team_key("bedrock-leaves")
    httpx.delete(f"{bedrock.peer.url}/__peer/ledger")
    url = (f"{bedrock.stack.gateway.url}/bedrock/model/claude-role-long/"
           "invoke-with-response-stream")
    with httpx.Client(timeout=60) as client, client.stream(
            "POST", url, json=HI, headers={"x-api-key": key}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/vnd.amazon.eventstream"
        bound = int(r.headers["x-inferplane-usd-bound"])
        permit = r.headers["x-inferplane-permit"]
        assert b":event-type" in next(r.iter_bytes())  # one chunk message, then gone
    usage = bedrock.settled(key)
    assert usage["usd_committed"] + usage["usd_liability"] == bound
    assert usage["usd_committed"] < bound
    settled = [a for a in bedrock.stack.audit() if a.get("permit") == permit
               and a.get("event") == "settled"]
    assert [a["outcome"] for a in settled] == ["uncertain"]
    assert bedrock.ledger() == []


DOC = Path(__file__).resolve().parents[2] / "docs" / "bedrock.md"


def doc_env(carrier: str, *, url: str, key: str) -> dict[str, str]:
    """Claude Code's settings as docs/bedrock.md shows them (its two ``sh`` blocks: the
    custom-header settings; the bearer line replacing their last two), for this run."""
    text = DOC.read_text().replace("https://gateway.example.com", url)
    blocks = [dict(line.removeprefix("export ").split("=", 1) for line in b.splitlines())
              for b in re.findall(r"```sh\n(.*?)```", text, re.S)]
    env = {k: v.strip('"').replace("sk-inf-...", key) for k, v in blocks[0].items()}
    if carrier == "bearer":
        del env["CLAUDE_CODE_SKIP_BEDROCK_AUTH"], env["ANTHROPIC_CUSTOM_HEADERS"]
        env |= {k: v.replace("sk-inf-...", key) for k, v in blocks[1].items()}
    return env


def test_the_docs_config_loads(tmp_path: Path) -> None:
    """docs/bedrock.md's provider config is valid as written, and its inference-profile
    model takes its prices from the catalog."""
    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None
    path = tmp_path / "mayu.yaml"
    path.write_text(f"data_dir: {tmp_path / 'data'}\n{block.group(1)}")
    checked = run_cli("config", "check", "--config", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listed = run_cli("models", "list", "--config", str(path), "--json")
    assert listed.returncode == 0, listed.stderr
    assert "3300000" in listed.stdout.replace("_", "")  # us. profile: $3.30 / MTok input


@pytest.mark.parametrize("carrier", ["custom-header", "bearer"])
def test_claude_code_bedrock_mode_runs_a_tool_loop(bedrock: Bedrock, claude: list[str],  # noqa: F811
                                                   tmp_path: Path, carrier: str) -> None:
    """Real Claude Code with CLAUDE_CODE_USE_BEDROCK=1 and ANTHROPIC_BEDROCK_BASE_URL at
    the gateway, our key in ANTHROPIC_CUSTOM_HEADERS (x-api-key, with
    CLAUDE_CODE_SKIP_BEDROCK_AUTH=1) or as AWS_BEARER_TOKEN_BEDROCK: it asks for its
    default inference profile, calls the Read tool the model asks for, sends the result
    back and prints the answer; committed equals the peer's record."""
    key = bedrock.stack.team_key(f"claude-code-{carrier}")
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    (project / "notes.txt").write_text("the notes say 42\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "LANG": "C.UTF-8", "DISABLE_AUTOUPDATER": "1",
           **doc_env(carrier, url=bedrock.stack.gateway.url, key=key)}
    httpx.delete(f"{bedrock.peer.url}/__peer/ledger")
    run = subprocess.run([*claude, "-p", f"READ:{project / 'notes.txt'}"], env=env,
                         cwd=project, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=90, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    ledger = [e for e in bedrock.ledger() if e["model"] == SONNET_ID]
    assert any(e["tool_call"] == str(project / "notes.txt") for e in ledger), ledger
    assert any(e["tool_result"] for e in ledger)
    assert any(e["stream"] for e in ledger)
    assert any("interleaved-thinking-2025-05-14" in (e["anthropic_beta"] or [])
               for e in ledger)
    usage = bedrock.settled(key)
    assert usage["usd_committed"] == sum(expected_cost(e) for e in ledger)
    assert usage["usd_liability"] == 0


def test_no_aws_secret_in_any_file_of_the_run(bedrock: Bedrock) -> None:
    """No secret key, web identity token or session token the run used (static, STS
    base, every session moto issued) is in the gateway's data dir (journal, audit,
    local stores) or its log."""
    issued: list[str] = httpx.get(f"{bedrock.peer.url}/__peer/issued").json()
    secrets = {STATIC[1], BASE[1], ENV["WRONG_SK"], ENV["WRONG_TOKEN"], WEB_TOKEN, *issued}
    assert len(secrets) >= 5
    files = [p for p in (bedrock.stack.config.parent / "data").rglob("*") if p.is_file()]
    files += list(bedrock.stack.config.parent.glob("gateway-*.log"))
    assert files
    for path in files:
        data = path.read_bytes()
        leaked = [s[:6] for s in secrets if s.encode() in data]
        assert not leaked, f"{path} holds secrets starting {leaked}"
