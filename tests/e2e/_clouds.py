"""A gateway in front of the cloud peer (``tests/e2e/_cloud_peer.py``): Azure OpenAI and
Vertex AI deployments with every kind of credential the ``azure``/``vertex`` kinds take.

:func:`start_clouds` writes a service-account key (a fresh RSA key; the peer gets only its
public half), starts the peer and ``mayu serve``, and returns a :class:`Clouds` with the
secrets it issued so a test can grep the run's files for each of them.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.e2e._cloud_peer import start_peer
from tests.e2e._procs import Proc, create_key, create_team, free_port, start_gateway
from tests.e2e.conftest import ADMIN_TOKEN, PRICE, server_section

PROJECT, REGION = "inferplane-test", "us-east5"
REGIONAL = {k: v * 11 // 10 for k, v in PRICE.items()}
"""A regional endpoint's price: the list price (``PRICE``) plus 10 %."""


@dataclass
class Clouds:
    gateway: Proc
    peer: Proc
    config: Path
    secrets: dict[str, str] = field(default_factory=dict)
    """What must never appear in a file of the run: name → value."""

    def key(self, team: str) -> str:
        create_team(self.config, team)
        return create_key(self.config, team)

    def _read(self, what: str) -> Any:
        return httpx.get(f"{self.peer.url}/__peer/{what}").json()

    def ledger(self) -> list[dict[str, Any]]:
        """The peer's record of the usage it reported, one entry per answer."""
        return list(self._read("ledger"))

    def requests(self) -> list[dict[str, Any]]:
        """What each request carried (path, query, which auth, anthropic-beta)."""
        return list(self._read("requests"))

    def issued(self) -> dict[str, list[str]]:
        """The access tokens the peer's token endpoints issued, by cloud."""
        return dict(self._read("issued"))

    def clear(self) -> None:
        httpx.delete(f"{self.peer.url}/__peer/ledger").raise_for_status()

    def assert_no_secret_in_files(self) -> None:
        """No secret of the run (api-key, identity header, service-account key, any
        access token the peer issued) in the gateway's log, config or data dir."""
        values = {**self.secrets, **{f"token {i}": t for i, t in enumerate(
            [*self.issued()["azure"], *self.issued()["gcp"]])}}
        assert len(values) > len(self.secrets), "no access token was issued"
        files = [self.config, self.gateway.log_path,
                 *(p for p in (self.config.parent / "data").rglob("*") if p.is_file())]
        for path in files:
            text = path.read_bytes().decode("latin-1")
            for name, value in values.items():
                assert value not in text, f"{name} found in {path}"

    def team_day(self, key: str) -> dict[str, int]:
        """``key``'s team's figures today (``/v1/usage``): µUSD committed, liability,
        reserved (zeros before its first request)."""
        rows = httpx.get(f"{self.gateway.url}/v1/usage",
                         headers={"Authorization": f"Bearer {key}"}).json()["data"]
        row = next((r for r in rows if r["scope"] == "team" and r["window"] == "day"), {})
        return {k: int(row.get(k, 0)) for k in ("usd_committed", "usd_liability",
                                                "usd_reserved")}

    def committed_usd(self, key: str) -> int:
        """µUSD committed today for ``key``'s team."""
        return self.team_day(key)["usd_committed"]

    def settled(self, key: str) -> dict[str, int]:
        """:meth:`team_day` once nothing is reserved (a hang guard, not a timing test)."""
        end = time.monotonic() + 60
        while (day := self.team_day(key))["usd_reserved"] and time.monotonic() < end:
            time.sleep(0.05)
        assert day["usd_reserved"] == 0, day
        return day

    def stop(self) -> None:
        self.gateway.stop()
        self.peer.stop()


def _service_account(workdir: Path, token_uri: str, *, name: str = "service-account",
                     public: Path | None = None) -> tuple[Path, str]:
    """A service-account key file for ``token_uri`` and its PEM; with ``public``, the
    public half written there (the peer's trusted key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    if public is not None:
        public.write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    sa = workdir / "secrets" / f"{name}.json"
    sa.parent.mkdir(exist_ok=True)
    sa.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "k1",
        "private_key": pem, "client_email": f"gateway@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1001", "token_uri": token_uri}))
    return sa, pem


def _tls_cert(workdir: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the peer's https listener) and its key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = workdir / "peer-cert.pem", workdir / "peer-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _key_line(pem: str) -> str:
    """One line of a PEM key's body: what a leak of the key would contain."""
    return pem.split("-----")[2].strip().splitlines()[1]


def _add_untrusted(config: dict[str, Any], workdir: Path, peer: Proc,
                   found: dict[str, str]) -> None:
    """A vertex provider whose service-account key the peer does not trust."""
    sa, pem = _service_account(workdir, f"{peer.url}/gcp/token", name="untrusted")
    found["untrusted_private_key"] = _key_line(pem)
    config["providers"].append({
        "name": "vertex-untrusted", "kind": "vertex",
        "base_url": f"{peer.url}/v1/projects/{PROJECT}/locations/{REGION}",
        "credentials": {"kind": "gcp", "service_account_file": str(sa)}, "timeout_s": 30})
    config["models"].append({
        "name": "claude-vertex-untrusted", "price": PRICE,
        "deployments": [{"provider": "vertex-untrusted", "upstream_model": "mock-claude"}]})


def _models() -> list[dict[str, Any]]:
    routes = {"gpt-azure": ("azure-v1", "mock-gpt"),
              "gpt-azure-dep": ("azure-deployments", "mock-gpt"),
              "gpt-azure-entra": ("azure-entra", "mock-gpt"),
              "gpt-azure-secret": ("azure-client-secret", "mock-gpt"),
              "claude-vertex": ("vertex", "mock-claude"),
              "claude-up": ("anthropic", "mock-claude"),
              "claude-vertex-quota": ("vertex", "mock-claude-quota"),
              "claude-vertex-cut": ("vertex", "mock-cut-stream"),
              "claude-vertex-slow": ("vertex", "mock-slow-stream"),
              "gpt-azure-wrong-key": ("azure-wrong-key", "mock-gpt"),
              # What Claude Code asks for in Vertex mode (claude-sonnet-4-5@20250929).
              "claude-sonnet-4-5-20250929": ("vertex", "mock-claude")}
    # max_input_tokens: Codex offers web_search, input the body does not carry.
    models = [{"name": name, "price": PRICE, "max_input_tokens": 200_000,
               "deployments": [{"provider": provider, "upstream_model": upstream}]}
              for name, (provider, upstream) in routes.items()]
    # Its input bound refined by Vertex's own count before every admission.
    models.append({"name": "claude-vertex-counted", "price": PRICE, "refine_input": "always",
                   "deployments": [{"provider": "vertex", "upstream_model": "mock-claude"}]})
    # A regional endpoint's premium (list + 10 %) as its deployment's own price.
    models.append({"name": "claude-vertex-regional", "price": PRICE, "deployments": [
        {"provider": "vertex", "upstream_model": "mock-claude", "price": REGIONAL}]})
    return models


@contextmanager
def running_clouds(workdir: Path, *, token_ttl_s: int = 3600,
                   untrusted: bool = False) -> Iterator[Clouds]:
    """:func:`start_clouds`, stopped on exit (a module fixture's body)."""
    clouds = start_clouds(workdir, token_ttl_s=token_ttl_s, untrusted=untrusted)
    try:
        yield clouds
    finally:
        clouds.stop()


def start_clouds(workdir: Path, *, token_ttl_s: int = 3600,
                 untrusted: bool = False) -> Clouds:
    """The peer and a gateway with one provider per cloud credential kind; with
    ``untrusted``, also ``claude-vertex-untrusted`` on a service account whose key the
    peer does not trust (it never gets a token; start-up waits 10 s for it)."""
    found = {"azure_key": "az-" + secrets.token_urlsafe(24),
             "msi_header": "msi-" + secrets.token_urlsafe(24),
             "client_secret": "cs-" + secrets.token_urlsafe(24),
             "wrong_key": "az-wrong-" + secrets.token_urlsafe(24)}
    cert, cert_key = _tls_cert(workdir)
    tls_port = free_port()
    # The peer must exist before the key file names its token endpoint: start it, then
    # write the key whose public half it reads on each token request.
    public = workdir / "sa-public.pem"
    peer = start_peer(workdir, {"PEER_AZURE_API_KEY": found["azure_key"],
                                "PEER_MSI_HEADER": found["msi_header"],
                                "PEER_GCP_PUBLIC_KEY": str(public),
                                "PEER_TOKEN_TTL_S": str(token_ttl_s),
                                "PEER_ENTRA_CLIENT_SECRET": found["client_secret"],
                                "PEER_TLS_CERT": str(cert), "PEER_TLS_KEY": str(cert_key)},
                      tls_port=tls_port)
    try:
        sa, pem = _service_account(workdir, f"{peer.url}/gcp/token", public=public)
        found["sa_private_key"] = _key_line(pem)
        vertex_base = f"{peer.url}/v1/projects/{PROJECT}/locations/{REGION}"
        config = {
            "data_dir": str(workdir / "data"), "demo": False,
            "server": server_section(),
            "providers": [
                {"name": "azure-v1", "kind": "azure", "base_url": f"{peer.url}/openai/v1",
                 "api_key_ref": "env:AZURE_OPENAI_API_KEY", "timeout_s": 30},
                {"name": "azure-deployments", "kind": "azure",
                 "base_url": f"{peer.url}/openai", "api_version": "2024-10-21",
                 "credentials": {"kind": "static", "ref": "env:AZURE_OPENAI_API_KEY"},
                 "timeout_s": 30},
                {"name": "azure-wrong-key", "kind": "azure",
                 "base_url": f"{peer.url}/openai/v1", "api_key_ref": "env:AZURE_WRONG_KEY"},
                {"name": "azure-entra", "kind": "azure", "base_url": f"{peer.url}/openai/v1",
                 "credentials": {"kind": "azure"}, "timeout_s": 30},
                {"name": "azure-client-secret", "kind": "azure",
                 "base_url": f"{peer.url}/openai/v1",
                 "credentials": {"kind": "azure", "tenant_id": "tenant-1",
                                 "client_id": "client-1",
                                 "client_secret_ref": "env:AZURE_CLIENT_SECRET",
                                 "authority_host": f"https://127.0.0.1:{tls_port}"},
                 "timeout_s": 30},
                {"name": "vertex", "kind": "vertex", "base_url": vertex_base,
                 "credentials": {"kind": "gcp", "service_account_file": str(sa)},
                 "timeout_s": 30},
                {"name": "anthropic", "kind": "anthropic", "base_url": f"{peer.url}/anthropic",
                 "api_key_ref": "env:AZURE_OPENAI_API_KEY", "timeout_s": 30}],
            "models": _models()}
        if untrusted:
            _add_untrusted(config, workdir, peer, found)
        path = workdir / "mayu.yaml"
        path.write_text(yaml.safe_dump(config))
        gateway = start_gateway(path, env={
            "MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN, "AZURE_OPENAI_API_KEY": found["azure_key"],
            # App Service's managed identity endpoint, as azure-identity reads it.
            "IDENTITY_ENDPOINT": f"{peer.url}/msi/token",
            "IDENTITY_HEADER": found["msi_header"],
            "AZURE_CLIENT_SECRET": found["client_secret"],
            "AZURE_WRONG_KEY": found["wrong_key"],
            # The peer's https authority is self-signed: trusted as requests trusts a CA.
            "REQUESTS_CA_BUNDLE": str(cert)})
    except BaseException:
        peer.stop()
        raise
    return Clouds(gateway=gateway, peer=peer, config=path, secrets=found)
