"""A strict local stand-in for Azure OpenAI and Vertex AI, with their token endpoints.

Run as ``python -m tests.e2e._cloud_peer --port N`` (a real process: :func:`start_peer`).
It answers with the mock model (``gateway.mock``: the same deterministic usage, prompt
cache classes included) in each cloud's own URL shape — a Messages turn that says
``PEER_TOOL`` and offers ``Bash`` gets a ``Bash`` call instead, so a real agent runs a
tool loop — and refuses what the cloud would:

- Azure OpenAI: ``/openai/v1/{chat/completions,responses,embeddings}`` and
  ``/openai/deployments/{d}/{chat/completions,embeddings}``, ``/openai/responses``; every
  request needs ``api-key`` (``PEER_AZURE_API_KEY``) or ``Authorization: Bearer`` with a
  token this peer issued for Azure OpenAI's scope and that has not expired (401 as Azure
  answers), and a known ``api-version`` where the form requires one (400 otherwise);
- the managed-identity endpoint of App Service (``GET /msi/token``, header
  ``X-IDENTITY-HEADER`` = ``PEER_MSI_HEADER``) and an Entra ID authority (tenant
  discovery and the client-credentials token endpoint, secret ``PEER_ENTRA_CLIENT_SECRET``;
  MSAL insists on https, so the peer also listens with TLS on ``--tls-port``), which
  azure-identity really calls;
- Vertex AI: ``/v1/projects/{p}/locations/{r}/publishers/anthropic/models/{m}:rawPredict``
  and ``:streamRawPredict`` (``count-tokens:rawPredict`` counting as the mock bills); a
  bearer token this peer's Google token endpoint issued and
  that has not expired (401 ``UNAUTHENTICATED`` otherwise), ``anthropic_version:
  vertex-2023-10-16`` in the body and no ``model`` (400 otherwise);
- Anthropic's own API (``/anthropic/v1/messages``, ``x-api-key``), for routing a
  cloud-shaped request to an Anthropic deployment;
- Google's OAuth2 token endpoint (``POST /gcp/token``), which google-auth really calls
  with a JWT signed by the service account's key: verified with its public key
  (``PEER_GCP_PUBLIC_KEY`` file), its issuer and audience.

Tokens live ``PEER_TOKEN_TTL_S`` seconds. ``GET /__peer/ledger`` is the upstream's record
of the usage it reported (one entry per answer, with the route); ``GET /__peer/requests``
what each request carried (path, query, which auth, ``anthropic-beta``, whether its last
message returns the tool's output), never a secret;
``GET /__peer/issued`` the access tokens it issued (for the tests' secrets grep).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jwt
import msgspec
from litestar import Litestar, Request, Response, delete, get, post
from litestar.response import Stream

from gateway.mock import MockReply, anthropic_count, plan_reply, play
from gateway.usage import Endpoint
from tests.e2e._procs import ROOT, Proc, free_port, wait_ready

AZURE_SCOPE = "https://cognitiveservices.azure.com"
GCP_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
VERTEX_VERSION = "vertex-2023-10-16"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
"""The ``aud`` google-auth signs a service account's assertion for, whatever its
``token_uri`` (Google's own token endpoint checks it)."""
TOOL_MARKER = "PEER_TOOL"
"""Said in a prompt, it makes a Messages turn that offers ``Bash`` answer with a call."""
TOOL_OUTPUT = "peer-tool-ran"
QUOTA_MARKER = "quota"
"""A Vertex model id containing it is answered Google's 429 ``RESOURCE_EXHAUSTED``."""
API_VERSIONS = frozenset({"2024-10-21", "2025-04-01-preview", "preview", "latest"})
"""``api-version`` values this peer accepts (a few GA and preview ones)."""


class Peer:
    def __init__(self) -> None:
        self.azure_key = os.environ.get("PEER_AZURE_API_KEY", "")
        self.msi_header = os.environ.get("PEER_MSI_HEADER", "")
        self.client_secret = os.environ.get("PEER_ENTRA_CLIENT_SECRET", "")
        self.gcp_key_file = os.environ.get("PEER_GCP_PUBLIC_KEY", "")
        """Read on each token request: the key is written once the peer's URL is known."""
        self.ttl_s = float(os.environ.get("PEER_TOKEN_TTL_S", "3600"))
        self.tokens: dict[str, tuple[str, float]] = {}
        """Issued token → (scope, expiry)."""
        self.ledger: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.issued: dict[str, list[str]] = {"azure": [], "gcp": []}

    def issue(self, scope: str) -> tuple[str, float]:
        token = "peer-" + secrets.token_urlsafe(32)
        expires = time.time() + self.ttl_s
        self.tokens[token] = (scope, expires)
        self.issued["azure" if scope == AZURE_SCOPE else "gcp"].append(token)
        return token, expires

    def bearer_ok(self, request: Request[Any, Any, Any], scope: str) -> bool:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return False
        got = self.tokens.get(auth[7:])
        return got is not None and got[0] == scope and time.time() < got[1]


def _json(doc: Any, status: int) -> Response[bytes]:
    return Response(msgspec.json.encode(doc), status_code=status,
                    media_type="application/json")


def _azure_error(status: int, code: str, message: str) -> Response[bytes]:
    return _json({"error": {"code": code, "message": message}}, status)


def _google_error(status: int, state: str, message: str) -> Response[bytes]:
    return _json({"error": {"code": status, "message": message, "status": state}}, status)


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + msgspec.json.encode(data) + b"\n\n"


def _asks_for_tool(body: dict[str, Any]) -> bool:
    """A Messages turn whose last user message says ``TOOL_MARKER`` in text (not a tool
    result) and that offers the ``Bash`` tool: answered with a tool call."""
    tools = body.get("tools") or []
    messages = body.get("messages") or []
    if not messages or not any(t.get("name") == "Bash" for t in tools):
        return False
    content = messages[-1].get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    return (not any(b.get("type") == "tool_result" for b in blocks)
            and any(TOOL_MARKER in str(b.get("text", "")) for b in blocks))


def tool_reply(reply: MockReply, body: dict[str, Any]) -> MockReply:
    """The mock's Messages answer turned into a ``Bash`` call (same usage and ledger
    entry), so a real agent runs a tool and sends its result back."""
    assert reply.entry is not None
    usage, model = reply.entry["usage"], str(body.get("model"))
    call = {"type": "tool_use", "id": f"toolu_peer_{reply.entry['id']}", "name": "Bash",
            "input": {"command": f"echo {TOOL_OUTPUT}", "description": "Print a word"}}
    message = {"id": f"msg_peer_{reply.entry['id']}", "type": "message",
               "role": "assistant", "model": model, "content": [call],
               "stop_reason": "tool_use", "stop_sequence": None, "usage": usage}
    if not body.get("stream"):
        return MockReply(200, body=msgspec.json.encode(message), entry=reply.entry)
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**usage, "output_tokens": 1}}
    events = [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {**call, "input": {}}}),
        _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {
            "type": "input_json_delta",
            "partial_json": msgspec.json.encode(call["input"]).decode()}}),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                               "usage": {"output_tokens": usage["output_tokens"]}}),
        _sse("message_stop", {"type": "message_stop"})]
    return MockReply(200, events=events, usage_at=4, entry=reply.entry)


async def _answer(peer: Peer, request: Request[Any, Any, Any], endpoint: Endpoint,
                  body: dict[str, Any], route: str) -> Any:
    reply = plan_reply(endpoint, body)
    if endpoint == "messages" and _asks_for_tool(body):
        reply = tool_reply(reply, body)

    def record(entry: dict[str, Any]) -> None:
        peer.ledger.append({**entry, "route": route})

    if reply.events:
        return Stream(play(reply, latency_s=0.0, record=record),
                      media_type="text/event-stream", status_code=reply.status,
                      headers={"cache-control": "no-cache", **reply.headers})
    if reply.entry is not None:
        record(reply.entry)
    return Response(reply.body or b"", status_code=reply.status,
                    media_type="application/json", headers=reply.headers)


def _seen(peer: Peer, request: Request[Any, Any, Any], auth: str, body: Any = None) -> None:
    messages = body.get("messages") if isinstance(body, dict) else None
    last = str(messages[-1]) if isinstance(messages, list) and messages else ""
    peer.requests.append({"path": request.url.path, "query": dict(request.query_params),
                          "auth": auth, "beta": request.headers.get("anthropic-beta"),
                          "tool_result": "tool_result" in last and TOOL_OUTPUT in last})


def create_peer_app(peer: Peer) -> Litestar:
    async def azure(request: Request[Any, Any, Any], endpoint: Endpoint,
                    deployment: str | None, *, version_required: bool) -> Any:
        key = request.headers.get("api-key")
        if key is not None:
            auth = "api-key" if peer.azure_key and secrets.compare_digest(
                key, peer.azure_key) else ""
        else:
            auth = "bearer" if peer.bearer_ok(request, AZURE_SCOPE) else ""
        if not auth:
            return _azure_error(401, "401", "Access denied due to invalid subscription key "
                                "or wrong API endpoint.")
        version = request.query_params.get("api-version")
        if (version is None and version_required) or (
                version is not None and version not in API_VERSIONS):
            return _azure_error(400, "BadRequest", f"API version not supported: {version}")
        _seen(peer, request, auth)
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError:
            return _azure_error(400, "BadRequest", "invalid JSON")
        if deployment is not None:
            body["model"] = deployment  # the deployment serves its own model
        if not isinstance(body.get("model"), str):
            return _azure_error(400, "BadRequest", "model: required")
        return await _answer(peer, request, endpoint, body, f"azure:{endpoint}")

    @post("/openai/v1/chat/completions", status_code=200)
    async def v1_chat(request: Request[Any, Any, Any]) -> Any:
        return await azure(request, "chat", None, version_required=False)

    @post("/openai/v1/responses", status_code=200)
    async def v1_responses(request: Request[Any, Any, Any]) -> Any:
        return await azure(request, "responses", None, version_required=False)

    @post("/openai/v1/embeddings", status_code=200)
    async def v1_embeddings(request: Request[Any, Any, Any]) -> Any:
        return await azure(request, "embeddings", None, version_required=False)

    @post("/openai/deployments/{deployment:str}/chat/completions", status_code=200)
    async def dep_chat(request: Request[Any, Any, Any], deployment: str) -> Any:
        return await azure(request, "chat", deployment, version_required=True)

    @post("/openai/deployments/{deployment:str}/embeddings", status_code=200)
    async def dep_embeddings(request: Request[Any, Any, Any], deployment: str) -> Any:
        return await azure(request, "embeddings", deployment, version_required=True)

    @post("/openai/responses", status_code=200)
    async def dep_responses(request: Request[Any, Any, Any]) -> Any:
        return await azure(request, "responses", None, version_required=True)

    @get("/msi/token")
    async def msi_token(request: Request[Any, Any, Any]) -> Response[bytes]:
        header = request.headers.get("x-identity-header", "")
        if not (peer.msi_header and secrets.compare_digest(header, peer.msi_header)):
            return _json({"error": "invalid_request",
                          "error_description": "X-IDENTITY-HEADER missing or wrong"}, 401)
        resource = request.query_params.get("resource", "")
        if resource.rstrip("/") != AZURE_SCOPE:
            return _json({"error": "invalid_resource",
                          "error_description": f"unknown resource {resource!r}"}, 400)
        token, expires = peer.issue(AZURE_SCOPE)
        return _json({"access_token": token, "expires_on": str(int(expires)),
                      "resource": resource, "token_type": "Bearer"}, 200)

    @get("/{tenant:str}/v2.0/.well-known/openid-configuration")
    async def entra_discovery(request: Request[Any, Any, Any], tenant: str) -> Any:
        base = f"{request.url.scheme}://{request.url.netloc}/{tenant}"
        return {"issuer": f"{base}/v2.0", "token_endpoint": f"{base}/oauth2/v2.0/token",
                "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode"}

    @post("/{tenant:str}/oauth2/v2.0/token", status_code=200)
    async def entra_token(request: Request[Any, Any, Any], tenant: str) -> Response[bytes]:
        form = await request.form()
        secret = str(form.get("client_secret", ""))
        if form.get("grant_type") != "client_credentials" or not (
                peer.client_secret and secrets.compare_digest(secret, peer.client_secret)):
            return _json({"error": "invalid_client",
                          "error_description": "AADSTS7000215: Invalid client secret"}, 401)
        if form.get("scope") != f"{AZURE_SCOPE}/.default":
            return _json({"error": "invalid_scope"}, 400)
        token, expires = peer.issue(AZURE_SCOPE)
        return _json({"token_type": "Bearer", "access_token": token,
                      "expires_in": int(expires - time.time())}, 200)

    @post("/gcp/token", status_code=200)
    async def gcp_token(request: Request[Any, Any, Any]) -> Response[bytes]:
        form = await request.form()
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return _json({"error": "unsupported_grant_type"}, 400)
        try:
            claims = jwt.decode(str(form.get("assertion", "")),
                                Path(peer.gcp_key_file).read_text(),
                                algorithms=["RS256"],
                                audience=GOOGLE_TOKEN_AUDIENCE)
        except jwt.PyJWTError as exc:
            return _json({"error": "invalid_grant",
                          "error_description": f"Invalid JWT Signature: {exc}"}, 400)
        if not str(claims.get("iss", "")).endswith(".iam.gserviceaccount.com"):
            return _json({"error": "invalid_grant", "error_description": "bad issuer"}, 400)
        if GCP_SCOPE not in str(claims.get("scope", "")).split():
            return _json({"error": "invalid_scope"}, 400)
        token, expires = peer.issue(GCP_SCOPE)
        return _json({"access_token": token, "expires_in": int(expires - time.time()),
                      "token_type": "Bearer"}, 200)

    @post("/v1/projects/{project:str}/locations/{location:str}/publishers/anthropic/"
          "models/{target:str}", status_code=200)
    async def vertex(request: Request[Any, Any, Any], project: str, location: str,
                     target: str) -> Any:
        if not peer.bearer_ok(request, GCP_SCOPE):
            return _google_error(401, "UNAUTHENTICATED", "Request had invalid "
                                 "authentication credentials. Expected OAuth 2 access "
                                 "token.")
        model, _, verb = target.partition(":")
        if verb not in ("rawPredict", "streamRawPredict"):
            return _google_error(404, "NOT_FOUND", f"unknown method {verb!r}")
        body = msgspec.json.decode(await request.body())
        _seen(peer, request, "bearer", body)
        if model == "count-tokens":  # the model is in the body here
            if body.pop("anthropic_version", None) != VERTEX_VERSION or not isinstance(
                    body.get("model"), str):
                return _google_error(400, "INVALID_ARGUMENT", "count-tokens: "
                                     "anthropic_version and model are required")
            return _json({"input_tokens": anthropic_count(body)}, 200)
        if QUOTA_MARKER in model:
            return _google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for "
                                 "aiplatform.googleapis.com/online_prediction_requests_"
                                 f"per_base_model with base model: {model}.")
        if body.get("anthropic_version") != VERTEX_VERSION:
            return _json({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": f"anthropic_version: must be {VERTEX_VERSION}"}}, 400)
        if "model" in body:
            return _json({"type": "error", "error": {
                "type": "invalid_request_error",
                "message": "model: Extra inputs are not permitted"}}, 400)
        if (verb == "streamRawPredict") != (body.get("stream") is True):
            return _google_error(400, "INVALID_ARGUMENT",
                                 f"{verb}: stream must be {verb == 'streamRawPredict'}")
        del body["anthropic_version"]
        body["model"] = model
        return await _answer(peer, request, "messages", body,
                             f"vertex:{project}/{location}:{verb}")

    @post("/anthropic/v1/messages", status_code=200)
    async def anthropic_messages(request: Request[Any, Any, Any]) -> Any:
        # Anthropic's own API (x-api-key = the Azure key, one secret fewer to hand out).
        key = request.headers.get("x-api-key", "")
        if not (peer.azure_key and secrets.compare_digest(key, peer.azure_key)):
            return _json({"type": "error", "error": {"type": "authentication_error",
                                                     "message": "invalid x-api-key"}}, 401)
        body = msgspec.json.decode(await request.body())
        _seen(peer, request, "x-api-key", body)
        return await _answer(peer, request, "messages", body, "anthropic")

    @get("/__peer/ledger")
    async def read_ledger() -> list[dict[str, Any]]:
        return peer.ledger

    @get("/__peer/requests")
    async def read_requests() -> list[dict[str, Any]]:
        return peer.requests

    @get("/__peer/issued")
    async def read_issued() -> dict[str, list[str]]:
        return peer.issued

    @delete("/__peer/ledger", status_code=204)
    async def clear() -> None:
        peer.ledger.clear()
        peer.requests.clear()

    @get(["/healthz", "/readyz"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return Litestar([v1_chat, v1_responses, v1_embeddings, dep_chat, dep_embeddings,
                     dep_responses, msi_token, entra_discovery, entra_token, gcp_token,
                     vertex, anthropic_messages, read_ledger, read_requests, read_issued,
                     clear, health],
                    openapi_config=None, request_max_body_size=None)


def start_peer(workdir: Path, env: dict[str, str], *, tls_port: int | None = None) -> Proc:
    """The peer as a real process on a free port (``env``: its ``PEER_*`` settings), and
    with TLS on ``tls_port`` too."""
    port = free_port()
    log = (workdir / f"cloud-peer-{port}.log").open("wb")
    extra = ["--tls-port", str(tls_port)] if tls_port else []
    popen = subprocess.Popen([sys.executable, "-m", "tests.e2e._cloud_peer", "--port",
                              str(port), *extra], stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                             cwd=str(workdir))
    log.close()
    return wait_ready(Proc(popen=popen, port=port,
                           log_path=workdir / f"cloud-peer-{port}.log"))


def main() -> int:
    import asyncio

    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-port", type=int, help="also https (PEER_TLS_CERT/_KEY)")
    args = parser.parse_args()
    app = create_peer_app(Peer())
    configs = [uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                              access_log=False)]
    if args.tls_port:
        configs.append(uvicorn.Config(
            app, host="127.0.0.1", port=args.tls_port, log_level="warning",
            access_log=False, ssl_certfile=os.environ["PEER_TLS_CERT"],
            ssl_keyfile=os.environ["PEER_TLS_KEY"]))

    async def serve() -> None:
        await asyncio.gather(*(uvicorn.Server(c).serve() for c in configs))
    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
