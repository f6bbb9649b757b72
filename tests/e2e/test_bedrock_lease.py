"""Bedrock in the lease profile: cloud credentials brokered by inferplaned, none on a plane.

Real processes: inferplaned (``POST /v1alpha1/credentials``) on a migrated Postgres,
holding the only AWS secret of the run (its base keys for moto's STS); three ``mayu
serve`` planes in the lease profile, each with its own data-plane token bound to its id
and teams, whose ``bedrock`` providers carry no cloud secret (``credentials.broker``:
the plane's token and a team); the Bedrock peer (``tests/e2e/_bedrock_peer.py``: every
SigV4 signature checked with botocore against the sessions moto issued, expired ones
refused) with moto's STS in its process. Sessions last 20 s, so each plane asks
inferplaned again twice or more under load. Money is checked against the peer's ledger;
every key id, secret and session token moto issued is looked for in every file of the
run but the peer's own log.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import yaml

from tests.e2e._controlplane import serve_inferplaned
from tests.e2e._lease import (
    ADMIN_TOKEN,
    WRITER_TOKEN,
    LeaseStack,
    budget_doc,
    wait_until,
)
from tests.e2e._procs import (
    ROOT,
    Proc,
    _env,
    run_cli,
    start_bedrock_peer,
    start_gateway,
)
from tests.e2e.conftest import PRICE, expected_cost

pytestmark = pytest.mark.e2e

DOC = ROOT / "docs" / "bedrock.md"
REGION = "us-east-1"
BASE = ("AKIDLEASEBASE0001", "lease-base-secret-0123456789abcdef")
"""inferplaned's own AWS keys: the one cloud secret of the run, never on a plane."""
ROLE = "arn:aws:iam::123456789012:role/inferplane-bedrock"
SESSION_S = 20
MOCK_ID = "us.anthropic.claude-mock-v1:0"
LONG_ID = "us.anthropic.claude-drawn-out-v1:0"
HI: dict[str, Any] = {"max_tokens": 40,
                      "messages": [{"role": "user", "content": "tell me a story"}]}
TOKENS = {"node-1": ("p1", ["team-a"]), "node-2": ("p2", ["team-b"]),
          "node-3": ("p3", ["team-a", "team-c"])}
"""Data-plane token name → (its plane, the teams it serves)."""
SECRETS = {name: f"e2e-lease-clouds-{name}-token" for name in TOKENS}


@dataclass
class CloudLease:
    stack: LeaseStack
    peer: Proc
    sts_url: str
    tokens: dict[str, str]
    """Plane → its data-plane token."""

    def plane_env(self, plane: str) -> dict[str, str]:
        """A plane's environment: its data-plane and admin tokens, no cloud secret."""
        return {"MAYU_CP_TOKEN": self.tokens[plane], "MAYU_ADMIN_TOKEN": ADMIN_TOKEN}

    def ledger(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = httpx.get(f"{self.peer.url}/__peer/ledger",
                                                  timeout=30).json()
        return entries

    def sessions(self) -> list[dict[str, Any]]:
        """Every session moto's STS issued (key id, secret, token, name)."""
        data = httpx.get(f"{self.sts_url}/moto-api/data.json", timeout=30).json()
        roles: list[dict[str, Any]] = data.get("sts", {}).get("AssumedRole", [])
        return roles

    def ask(self, plane: str, team: str, *, credential: str = "bedrock",
            dataplane_id: str | None = None, token: str | None = None) -> httpx.Response:
        """``POST /v1alpha1/credentials`` as ``plane``'s token (or ``token``)."""
        return httpx.post(
            f"{self.stack.control_url}/v1alpha1/credentials", timeout=30,
            json={"credential": credential, "team": team,
                  "dataplane_id": plane if dataplane_id is None else dataplane_id},
            headers={"Authorization": f"Bearer {token or self.tokens[plane]}"})

    def client(self, plane: str, team: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.stack.planes[plane].url, max_retries=0,
                                   api_key=self.stack.keys[(plane, team)], timeout=90)

    def settled(self, plane: str, team: str) -> dict[str, Any]:
        """The plane's team-day figures once nothing is reserved (a hang guard)."""
        wait_until(lambda: not self.stack.team_usage(plane, team)["usd_reserved"],
                   what=f"{plane}/{team} settled")
        return self.stack.team_usage(plane, team)


def start_peer(workdir: Path) -> tuple[Proc, str]:
    (workdir / "peer").mkdir()
    return start_bedrock_peer(workdir / "peer", "--drawn-out-s", "24", region=REGION)


def start_inferplaned(workdir: Path, dsn: str, port: int, sts_url: str) -> Proc:
    """inferplaned with the credentials it brokers, logging at info (each issue)."""
    aws = {"region": REGION, "role_arn": ROLE, "access_key_id_ref": "env:IPD_AWS_AK",
           "secret_access_key_ref": "env:IPD_AWS_SK", "external_id": "inferplane-e2e",
           "duration_s": SESSION_S, "sts_endpoint_url": sts_url}
    config = workdir / "inferplaned.yaml"
    config.write_text(yaml.safe_dump({
        "database": {"dsn_ref": "env:IPD_DSN", "pool_min_size": 1, "pool_max_size": 4},
        "auth": {"writer_tokens_ref": {"e2e": "env:IPD_TOKEN"},
                 "dataplane_tokens_ref": {
                     name: {"token_ref": f"env:IPD_{name.upper().replace('-', '_')}",
                            "planes": [plane], "teams": teams}
                     for name, (plane, teams) in TOKENS.items()}},
        "credentials": {"bedrock": {"aws": aws, "teams": ["team-a", "team-b", "team-c"]},
                        "bedrock-ml": {"aws": aws, "teams": ["ml"]}}}))
    env = {"IPD_DSN": dsn, "IPD_TOKEN": WRITER_TOKEN, "IPD_AWS_AK": BASE[0],
           "IPD_AWS_SK": BASE[1],
           **{f"IPD_{n.upper().replace('-', '_')}": t for n, t in SECRETS.items()}}
    return serve_inferplaned(config, port=port, log_path=workdir / f"inferplaned-{port}.log",
                             env=env, log_level="info")


def plane_config(stack: LeaseStack, plane: str, teams: list[str], peer: Proc, *,
                 foreign: str | None = None) -> Path:
    """A lease plane whose bedrock providers (one per team; ``foreign``: one more, for a
    team its token does not serve) get their credentials from inferplaned only."""

    def provider(team: str) -> dict[str, Any]:
        return {"name": f"bedrock-{team}", "kind": "bedrock", "base_url": peer.url,
                "timeout_s": 60, "credentials": {
                    "kind": "aws", "region": REGION, "broker": {
                        "url": stack.control_url, "token_ref": "env:MAYU_CP_TOKEN",
                        "credential": "bedrock", "team": team, "dataplane_id": plane}}}

    served = [*teams, *([foreign] if foreign else [])]
    models = [{"name": f"claude-{team}{suffix}", "price": PRICE, "max_input_tokens": 200_000,
               "deployments": [{"provider": f"bedrock-{team}", "upstream_model": model}]}
              for team in served for suffix, model in (("", MOCK_ID), ("-long", LONG_ID))]
    path = stack.workdir / f"{plane}.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(stack.workdir / plane), "demo": False,
        "server": {"replica_id": plane, "max_output_tokens": 100_000,
                   "admin_token_ref": "env:MAYU_ADMIN_TOKEN"},
        "control_plane": {"url": stack.control_url, "token_ref": "env:MAYU_CP_TOKEN",
                          "dataplane_id": plane, "max_heartbeat_interval_s": 0.5,
                          "timeout_s": 2.0},
        "providers": [provider(team) for team in served], "models": models}))
    return path


@pytest.fixture(scope="module")
def lease(tmp_path_factory: pytest.TempPathFactory, pg_module_dsn: str
          ) -> Iterator[CloudLease]:
    """The peer, inferplaned, three planes with their teams' keys. 60-120 s on this
    machine: eight ``mayu`` CLI runs for the teams and keys, and p1's start waits 5 s for
    the team-b session it is refused."""
    workdir = tmp_path_factory.mktemp("bedrock-lease")
    peer, sts_url = start_peer(workdir)
    stack = LeaseStack(workdir=workdir, dsn=pg_module_dsn)
    try:
        stack.control = start_inferplaned(workdir, pg_module_dsn, stack.port, sts_url)
        # FailOpen: with inferplaned down a plane still admits, so what a restarted
        # plane answers without it is its credentials' state alone.
        for team in ("team-a", "team-b", "team-c"):
            stack.publish(budget_doc(team, team, limit_milli=50_000, grant_milli=2_000,
                                     failure="FailOpen"))
        lease = CloudLease(stack, peer, sts_url,
                           {plane: SECRETS[name] for name, (plane, _) in TOKENS.items()})
        for plane, teams in TOKENS.values():
            stack.configs[plane] = plane_config(
                stack, plane, teams, peer, foreign="team-b" if plane == "p1" else None)
            for team in teams:
                stack.keys[(plane, team)] = stack.create_key(plane, team)
            stack.planes[plane] = start_gateway(stack.configs[plane],
                                                env=lease.plane_env(plane))
        yield lease
    finally:
        stack.stop()
        peer.stop()


def _call(client: anthropic.Anthropic, model: str, stream: bool) -> None:
    if stream:
        with client.messages.stream(model=model, **HI) as s:
            assert s.get_final_message().usage.output_tokens > 0
    else:
        assert client.messages.create(model=model, **HI).content


def test_three_planes_sign_with_brokered_sessions_refreshed_mid_run(
        lease: CloudLease) -> None:
    """Four (plane, team) pairs on three planes call Bedrock for 45 s, JSON and
    streamed, with a 24 s stream in flight across a session's expiry: no request fails
    (a lease's own 503 ``lease_exhausted`` is retried: the budget, not the credentials);
    each pair signed with at least three sessions, named for its team and plane (what
    CloudTrail shows); each plane's committed equals the peer's ledger of its sessions to
    the µUSD, and inferplaned's ledger of each team's budget equals its planes' sum.
    ~60 s: sessions last 20 s (the shortest that leaves a refresh margin on this machine)
    and three must pass."""
    httpx.delete(f"{lease.peer.url}/__peer/ledger", timeout=30)
    failures: list[str] = []
    done = {pair: 0 for pair in lease.stack.keys}
    lease_waits: list[str] = []
    clients = {pair: lease.client(*pair) for pair in lease.stack.keys}
    stop = time.monotonic() + 45

    def attempt(plane: str, team: str, model: str, stream: bool) -> bool:
        """One call; False for the lease's own "retry shortly" (503 lease_exhausted:
        the plane's budget allowance being renewed, refused before anything was sent),
        any other failure recorded."""
        try:
            _call(clients[(plane, team)], model, stream=stream)
            return True
        except anthropic.APIStatusError as exc:
            if exc.status_code == 503 and "lease_exhausted" in str(exc.body):
                lease_waits.append(f"{plane}/{team}")
                return False
            failures.append(f"{plane}/{team} {model}: {exc.status_code}: {exc.body}")
        except Exception as exc:  # recorded; the assertion below names it
            failures.append(f"{plane}/{team} {model}: {type(exc).__name__}: {exc}")
        return False

    def work(plane: str, team: str) -> None:
        while time.monotonic() < stop:
            if attempt(plane, team, f"claude-{team}", stream=done[(plane, team)] % 2 == 1):
                done[(plane, team)] += 1
            time.sleep(0.2)

    def long_stream() -> None:
        while not attempt("p2", "team-b", "claude-team-b-long", stream=True) and (
                not failures and time.monotonic() < stop):
            time.sleep(0.5)

    threads = [threading.Thread(target=work, args=pair) for pair in lease.stack.keys]
    threads.append(threading.Thread(target=long_stream))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"lease_exhausted waits (retried, nothing sent): {len(lease_waits)}")
    assert not failures, failures[:5]
    assert all(n >= 10 for n in done.values()), done

    ledger = lease.ledger()
    assert len(ledger) == sum(done.values()) + 1
    for (plane, team), n in done.items():
        mine = [e for e in ledger if e["session"] == f"inferplane-{team}@{plane}"]
        assert len(mine) == n + (1 if (plane, team) == ("p2", "team-b") else 0)
        assert len({e["key_id"] for e in mine}) >= 3, (plane, team)
        usage = lease.settled(plane, team)
        assert usage["usd_committed"] == sum(expected_cost(e) for e in mine), (plane, team)
        assert usage["usd_liability"] == 0
    assert {e["session"] for e in ledger} == {
        f"inferplane-{team}@{plane}" for plane, team in lease.stack.keys}
    spent = {team: sum(expected_cost(e) for e in ledger
                       if e["session"].startswith(f"inferplane-{team}@"))
             for team in ("team-a", "team-b", "team-c")}
    wait_until(lambda: {t: lease.stack.account(f"{t}/spend")["committed"] for t in spent}
               == spent, what="each team's spend on every plane reported to inferplaned")
    assert all(lease.stack.account(f"{t}/spend")["liability"] == 0 for t in spent)


def test_a_plane_gets_no_credential_for_a_team_it_does_not_serve(
        lease: CloudLease) -> None:
    """p1's token serves team-a only: its provider for team-b never gets a session (the
    model answers 503, nothing reaches the peer), and asking inferplaned directly for
    team-b, as another plane's id, for a credential not granted to the team, with a
    writer token or no token: refused, with no credential field in the answer, each
    refusal logged by inferplaned without a secret."""
    refused = httpx.post(f"{lease.stack.planes['p1'].url}/v1/messages", timeout=60,
                         json={"model": "claude-team-b", **HI},
                         headers={"x-api-key": lease.stack.keys[("p1", "team-a")]})
    assert refused.status_code == 503, refused.text
    assert "credentials are unavailable" in refused.json()["error"]["message"]
    assert "inferplaned answered 403" in lease.stack.planes["p1"].logs()
    assert not [e for e in lease.ledger() if e["session"] == "inferplane-team-b@p1"]

    answers = {
        "foreign team": lease.ask("p1", "team-b"),
        "foreign plane": lease.ask("p1", "team-a", dataplane_id="p2"),
        "not the credential's team": lease.ask("p3", "team-a", credential="bedrock-ml"),
        "writer token": lease.ask("p1", "team-a", token=WRITER_TOKEN),
        "unknown token": lease.ask("p1", "team-a", token="not-a-token-0123456789"),
        "unknown credential": lease.ask("p1", "team-a", credential="vertex")}
    assert {why: r.status_code for why, r in answers.items()} == {
        "foreign team": 403, "foreign plane": 403, "not the credential's team": 403,
        "writer token": 403, "unknown token": 401, "unknown credential": 404}
    for why, r in answers.items():
        assert set(r.json()) == {"error"}, why
    assert "does not serve team 'team-b'" in answers["foreign team"].json()["error"]["message"]
    logs = lease.stack.control.logs() if lease.stack.control else ""
    assert "credential 'bedrock' for team 'team-b' refused to token 'node-1'" in logs

    granted = lease.ask("p3", "team-c")
    assert granted.status_code == 200 and granted.headers["cache-control"] == "no-store"
    body = granted.json()
    assert body["session_name"] == "inferplane-team-c@p3" and body["team"] == "team-c"
    assert {"access_key_id", "secret_access_key", "session_token", "expiration"} <= set(body)


def test_a_plane_restarted_without_inferplaned_serves_bedrock_once_it_has_credentials(
        lease: CloudLease) -> None:
    """inferplaned down, p2 restarted: it holds no credential (none was written
    anywhere), so its Bedrock model answers 503 naming the credentials, nothing sent and
    nothing charged; inferplaned back on the same port, the plane's retry gets a session
    and the same request succeeds, settled to the peer's record. ~35 s: the restarted
    plane waits 5 s for a first credential, and retries every 5 s once inferplaned is
    back (its own start on this machine takes several)."""
    stack = lease.stack
    stack.stop_control()
    stack.stop_plane("p2")
    stack.planes["p2"] = start_gateway(stack.configs["p2"], env=lease.plane_env("p2"))
    before = stack.team_usage("p2", "team-b")
    httpx.delete(f"{lease.peer.url}/__peer/ledger", timeout=30)
    refused = httpx.post(f"{stack.planes['p2'].url}/v1/messages", timeout=60,
                         json={"model": "claude-team-b", **HI},
                         headers={"x-api-key": stack.keys[("p2", "team-b")]})
    assert refused.status_code == 503, refused.text
    assert "credentials are unavailable" in refused.json()["error"]["message"]
    assert lease.ledger() == []

    stack.control = start_inferplaned(stack.workdir, stack.dsn, stack.port, lease.sts_url)
    client = lease.client("p2", "team-b")

    def served() -> bool:
        try:
            return bool(client.messages.create(model="claude-team-b", **HI).content)
        except anthropic.APIStatusError as exc:
            assert exc.status_code == 503, exc  # only the wait for credentials
            return False
    wait_until(served, what="p2 signs again once inferplaned answers")
    ledger = lease.ledger()
    assert [e["session"] for e in ledger] == ["inferplane-team-b@p2"]
    after = lease.settled("p2", "team-b")
    assert after["usd_committed"] - before["usd_committed"] == expected_cost(ledger[0])


def test_no_issued_credential_rests_in_any_file_of_the_run(lease: CloudLease) -> None:
    """No plane's config or environment holds an AWS secret, and no key id, secret key
    or session token moto issued (nor inferplaned's base secret, nor a plane's token)
    is in any file of the run: every plane's data dir (stores, journal, audit), every
    log (planes, inferplaned) and config. The peer's own log is the cloud's, not ours."""
    sessions = lease.sessions()
    assert len(sessions) >= 5, len(sessions)
    secrets = {BASE[1]: "inferplaned's base secret",
               **{t: f"{n}'s data-plane token" for n, t in SECRETS.items()},
               **{s[k]: f"{k} of {s['session_name']}" for s in sessions
                  for k in ("access_key_id", "secret_access_key", "session_token")}}
    for plane, config in lease.stack.configs.items():
        text = config.read_text()
        assert "access_key_id_ref" not in text and "role_arn" not in text, plane
    files = [p for p in lease.stack.workdir.rglob("*")
             if p.is_file() and lease.peer.log_path.parent not in p.parents]
    assert {p.name for p in files} >= {"mayu.db", "p1.yaml", "inferplaned.yaml"}
    assert any(p.name.startswith("gateway-") for p in files)
    for path in files:
        data = path.read_bytes()
        leaked = [what for value, what in secrets.items() if value.encode() in data]
        assert not leaked, f"{path} holds {leaked[:3]}"


def test_the_documented_lease_configs_check(tmp_path: Path) -> None:
    """docs/bedrock.md's two "Lease profile" configs pass ``inferplaned check-config`` and
    ``mayu config check`` as written (the token file put where they say it is)."""
    section = DOC.read_text().split("## Lease profile", 1)[1].split("\n## ", 1)[0]
    daemon, plane = re.findall(r"```yaml\n(.*?)```", section, re.S)[:2]
    secret = tmp_path / "inferplaned-node-a"
    secret.write_text("a-data-plane-token-0123456789")
    paths = {}
    for name, text in (("inferplaned", daemon), ("mayu", plane)):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(text.replace("/run/secrets/inferplaned-node-a", str(secret))
                               + (f"data_dir: {tmp_path / 'data'}\n" if name == "mayu"
                                  else ""))
    checked = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "check-config", "--config",
         str(paths["inferplaned"])], capture_output=True, text=True, cwd=str(ROOT),
        env=_env({}), timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    checked = run_cli("config", "check", "--config", str(paths["mayu"]))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    mixed = paths["mayu"].read_text().replace(
        "      region: us-east-1\n      broker:",
        "      region: us-east-1\n      role_arn: arn:aws:iam::1:role/x\n      broker:")
    paths["mayu"].write_text(mixed)
    refused = run_cli("config", "check", "--config", str(paths["mayu"]))
    assert refused.returncode != 0 and "remove role_arn" in refused.stdout + refused.stderr
