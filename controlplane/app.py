"""inferplaned's HTTP API: GovernancePolicy documents published as numbered generations.

``create_app(config)`` builds the Litestar app; its lifespan opens and closes the psycopg
pool. Every accepted write goes through :func:`gateway.policy.publish` (the shared
Postgres policy store), which validates the *whole* resulting set with
``compile_documents`` before bumping the generation, so an invalid document (422, every
problem with its path) never disturbs what is published. Each write is attributed to
the name of the token that made it.

Routes: ``PUT/GET/DELETE /v1alpha1/policies/{name}``, ``GET /v1alpha1/policies``,
``GET /v1alpha1/generation``, ``GET /v1alpha1/changes?since=N``, the lease profile's
``POST /v1alpha1/sync`` (data plane tokens, each for its own plane ids) and
``GET /v1alpha1/dataplanes`` (:mod:`controlplane.leases`), the planes' request logs
``POST /v1alpha1/usage`` (:mod:`controlplane.usage`), the token exchange, its JWKS
and user revocation (:mod:`controlplane.identity`), ``POST /v1alpha1/credentials``
(cloud credentials brokered to lease planes, :mod:`controlplane.credentials`), ``GET /metrics``
(:mod:`controlplane.metrics`, reader and writer tokens), ``/healthz``, ``/readyz``, and
the OpenAPI document of them all, ``GET /v1alpha1/openapi.json`` (:mod:`controlplane.openapi`).
Every error — ours, Litestar's own refusals (404, 405, 413) and an unhandled bug (500,
logged) — is JSON ``{"error": {"message", "problems": [{"path", "message"}]}}``
(docs/inferplaned.md, "Errors").
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import msgspec
import yaml
from litestar import Litestar, Request, Response, delete, get, post, put
from litestar.exceptions import HTTPException
from litestar.params import FromPath, FromQuery

from controlplane import credentials, identity, keys, leases, usage
from controlplane.auth import Identity, TokenAuth
from controlplane.body import bounded_body, decode_body
from controlplane.identity import Broker, people_for
from controlplane.metrics import ControlPlaneMetrics
from controlplane.openapi import OPENAPI
from controlplane.settings import ControlPlaneConfig, resolve_tokens
from gateway.db import open_pool, wrap_exceptions
from gateway.errors import BadRequest, InferplaneError, NotFound, PayloadTooLarge
from gateway.jsondepth import check_json_depth, check_yaml_depth, too_deep_error
from gateway.lease import SyncRequest
from gateway.policy import (
    CurrentPolicy,
    GenerationInfo,
    PolicyInvalid,
    changes,
    current,
    publish,
    validate_document,
)

log = logging.getLogger("inferplaned")
_WHAT = "policy database"


def _error(status: int, message: str, problems: list[tuple[str, str]] | None = None,
           headers: dict[str, str] | None = None) -> Response[dict[str, Any]]:
    body = {"error": {"message": message,
                      "problems": [{"path": p, "message": m} for p, m in problems or []]}}
    return Response(body, status_code=status, headers=headers or {})


def _on_inferplane_error(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, InferplaneError)
    if exc.status >= 500:
        log.error("%s: %s", type(exc).__name__, exc.message)
    headers = exc.headers()
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="inferplaned"'
    problems = exc.problems if isinstance(exc, PolicyInvalid) else None
    return _error(exc.status, exc.message, problems, headers)


def _on_http_error(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))


def _on_unhandled(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """A bug: logged with its traceback, answered in the one error shape (never
    Litestar's own ``{"status_code", "detail"}``)."""
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error(500, "internal error (logged by inferplaned)")


def _auth(request: Request[Any, Any, Any], *, write: bool) -> Identity:
    auth: TokenAuth = request.app.state.auth
    return auth.require(request.headers.get("authorization"), write=write)


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _parse_document(body: bytes, content_type: str) -> dict[str, Any]:
    """A JSON or YAML document (YAML is a superset of JSON; JSON is tried first).

    Nesting deeper than ``gateway.jsondepth.MAX_JSON_DEPTH`` (and any YAML alias) is
    refused with 400 before the document is decoded, so no decoder recursion can fail.
    """
    is_json = "json" in content_type
    if is_json:
        check_json_depth(body, what="body")
    else:
        check_yaml_depth(body, what="body")
    try:
        doc = json.loads(body) if is_json else yaml.safe_load(body)
    except (ValueError, yaml.YAMLError) as exc:
        raise BadRequest(f"body: not a valid JSON or YAML document ({exc})") from exc
    except RecursionError as exc:  # unreachable after the check; never a 500 if it is
        raise too_deep_error("body") from exc
    if not isinstance(doc, dict):
        raise BadRequest("body: must be one GovernancePolicy document (a mapping)")
    return doc


def _check_document(name: str, doc: dict[str, Any]) -> None:
    """Per-document validation before touching the database; raises with every problem."""
    _, problems = validate_document(doc)
    meta = doc.get("metadata")
    doc_name = meta.get("name") if isinstance(meta, dict) else None
    if doc_name != name:
        problems.insert(0, ("metadata.name", f"must equal the name in the URL ({name!r}); "
                                              f"got {doc_name!r}"))
    if problems:
        raise PolicyInvalid([(f"{name}:{p}", m) for p, m in problems])


async def _current(request: Request[Any, Any, Any]) -> CurrentPolicy:
    async with wrap_exceptions(_WHAT), request.app.state.pool.connection() as conn:
        return await current(conn)


def _generation(info: GenerationInfo | CurrentPolicy) -> dict[str, Any]:
    return {"namespace": info.namespace, "generation": info.generation,
            "fingerprint": info.fingerprint}


@put("/v1alpha1/policies/{name:str}", status_code=200)
async def put_policy(request: Request[Any, Any, Any], name: FromPath[str]) -> dict[str, Any]:
    identity = _auth(request, write=True)
    body = await request.body()
    if len(body) > request.app.state.config.max_body_bytes:
        raise PayloadTooLarge(f"body: larger than max_body_bytes "
                              f"({request.app.state.config.max_body_bytes})")
    doc = _parse_document(body, request.headers.get("content-type", ""))
    _check_document(name, doc)
    async with wrap_exceptions(_WHAT), request.app.state.pool.connection() as conn:
        info = await publish(conn, put={name: doc}, author=identity.name)
    log.info("generation %s published by %s: put %s", info.generation,
             identity.name, name)
    return {"name": name, "action": "put", "author": identity.name, **_generation(info)}


@delete("/v1alpha1/policies/{name:str}", status_code=200)
async def delete_policy(request: Request[Any, Any, Any], name: FromPath[str]) -> dict[str, Any]:
    identity = _auth(request, write=True)
    # publish raises NotFound (404) for a name that is not published, under its lock.
    async with wrap_exceptions(_WHAT), request.app.state.pool.connection() as conn:
        info = await publish(conn, delete=[name], author=identity.name)
    log.info("generation %s published by %s: delete %s", info.generation,
             identity.name, name)
    return {"name": name, "action": "delete", "author": identity.name, **_generation(info)}


@get("/v1alpha1/policies/{name:str}")
async def get_policy(request: Request[Any, Any, Any], name: FromPath[str]) -> Response[Any]:
    _auth(request, write=False)
    state = await _current(request)
    doc = state.documents.get(name)
    if doc is None:
        raise NotFound(f"policy {name!r} is not published")
    return Response(doc, headers={"X-Inferplane-Generation": str(state.generation)})


@get("/v1alpha1/policies")
async def list_policies(request: Request[Any, Any, Any]) -> dict[str, Any]:
    _auth(request, write=False)
    state = await _current(request)
    docs = state.documents
    return {**_generation(state), "items": [docs[n] for n in sorted(docs)]}


@get("/v1alpha1/generation")
async def generation(request: Request[Any, Any, Any]) -> dict[str, Any]:
    _auth(request, write=False)
    return _generation(await _current(request))


@get("/v1alpha1/changes")
async def list_changes(request: Request[Any, Any, Any],
                       since: FromQuery[int] = 0) -> dict[str, Any]:
    _auth(request, write=False)
    if since < 0:
        raise BadRequest("since: must be >= 0")
    async with wrap_exceptions(_WHAT), request.app.state.pool.connection() as conn:
        rows = await changes(conn, since=since)
    fields = ("generation", "name", "action", "author", "at", "before", "after")
    return {"since": since,
            "changes": [{f: _jsonable(getattr(r, f)) for f in fields} for r in rows]}


def _json(value: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(value), media_type="application/json")


@post("/v1alpha1/sync", status_code=200)
async def sync(request: Request[Any, Any, Any]) -> Response[bytes]:
    """One lease-profile heartbeat: report, renewal, rejections in; policy, leases out."""
    auth: TokenAuth = request.app.state.auth
    identity = auth.require_dataplane(request.headers.get("authorization"))
    body = await bounded_body(request, limit="max_sync_bytes")
    req = decode_body(body, SyncRequest, what="a sync request")
    ledger: leases.Ledger = request.app.state.ledger
    try:
        auth.require_plane(identity, req.dataplane.id)
    except InferplaneError as exc:
        ledger.refuse_token(req, identity, exc)
        raise
    try:
        answer = await ledger.sync(req, identity)
    except leases.PlaneConflict as exc:
        if exc.answer is None:
            raise
        # The error shape plus the policy pull (no leases): see PlaneConflict.answer.
        refused = {"error": {"message": exc.message, "problems": []}, "answer": exc.answer}
        return Response(msgspec.json.encode(refused), status_code=exc.status,
                        media_type="application/json", headers=exc.headers())
    # The keys of the plane's teams made here or brokered here, when they changed.
    broker: Broker | None = request.app.state.broker
    people = await people_for(request.app.state.pool, broker, req, identity.teams)
    answer = msgspec.structs.replace(answer, people=people)
    return _json(answer)


@get("/v1alpha1/dataplanes")
async def dataplanes(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every data plane that synced: API versions, generation, rejections, leases."""
    _auth(request, write=False)
    return _json({"dataplanes": await leases.dataplanes(request.app.state.pool)})


@get("/metrics")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus metrics (reader and writer tokens): lease refusals and frame changes."""
    _auth(request, write=False)
    m: ControlPlaneMetrics = request.app.state.metrics
    return Response(m.render(), media_type=m.content_type)


@get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz")
async def readyz(request: Request[Any, Any, Any]) -> Response[Any]:
    if getattr(request.app.state, "draining", False):  # SIGTERM: gateway.server.serve
        return _error(503, "draining")
    try:
        async with wrap_exceptions(_WHAT), request.app.state.pool.connection() as conn:
            await conn.execute("SELECT 1")
    except InferplaneError as exc:
        return _error(503, exc.message)
    return Response({"status": "ready"})


def create_app(config: ControlPlaneConfig) -> Litestar:
    """The inferplaned app for ``config`` (tokens resolved now: a bad ref fails here)."""
    tokens = resolve_tokens(config.auth)
    auth = TokenAuth(tokens.writers, tokens.readers, tokens.dataplanes, planes=tokens.planes,
                     teams=tokens.teams)
    for name in tokens.unscoped:
        log.warning("data plane token %r may report for ANY plane id (no "
                    "auth.dataplane_tokens_ref.%s.planes): a holder of it can claim a "
                    "plane id no other token has synced yet; give each node its own token "
                    "bound to its id", name, name)
    pool = open_pool(config.database, name="inferplaned")
    metrics_ = ControlPlaneMetrics()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await pool.open(wait=False)
        try:
            yield
        finally:
            await pool.close()

    app = Litestar(
        route_handlers=[put_policy, delete_policy, get_policy, list_policies, generation,
                        list_changes, sync, dataplanes, metrics, healthz, readyz,
                        *identity.ROUTES, *keys.ROUTES, *credentials.ROUTES,
                        *usage.ROUTES],
        lifespan=[lifespan],
        exception_handlers={InferplaneError: _on_inferplane_error,
                            HTTPException: _on_http_error, Exception: _on_unhandled},
        # The handler enforces max_body_bytes with a clear message; this is the backstop.
        request_max_body_size=max(config.max_body_bytes, config.max_sync_bytes) + 1,
        openapi_config=OPENAPI,
    )
    app.state.config = config
    app.state.auth = auth
    app.state.pool = pool
    app.state.metrics = metrics_
    app.state.broker = None if config.identity is None else identity.Broker(config.identity)
    app.state.credentials = credentials.CredentialBroker(config.credentials)
    app.state.usage_log = usage.UsageLog(pool=pool, registry=metrics_.registry)
    app.state.ledger = leases.Ledger(pool=pool, cache=leases.PolicyCache(),
                                     settings=config.lease, tokens=auth.dataplane_names,
                                     metrics=metrics_)
    return app
