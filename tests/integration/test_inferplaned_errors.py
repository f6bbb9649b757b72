"""``inferplaned`` as a real process: deep nesting on every route is a 400, and every error
— its own, Litestar's routing refusals — comes in the one documented shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.jsondepth import MAX_JSON_DEPTH
from tests.e2e._procs import Proc
from tests.integration.test_inferplaned_process import start_inferplaned, write_config

pytestmark = pytest.mark.integration

DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
DEEP_YAML = b"- " * 100_000 + b"1"
ALIAS_YAML = b"apiVersion: inferplane.dev/v1alpha1\nmetadata: &m {name: p}\nspec: *m\n"
JSON, YAML = "application/json", "application/yaml"


@pytest.fixture
def server(tmp_path: Any, pg_dsn: str) -> Iterator[Proc]:
    """inferplaned on loopback without tokens (every route reachable), on a fresh database."""
    proc = start_inferplaned(write_config(tmp_path), {"IPD_DSN": pg_dsn})
    try:
        yield proc
    finally:
        proc.stop()


def _error(r: httpx.Response, status: int) -> str:
    """The one error shape: {"error": {"message": str, "problems": [...]}}; the message."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "problems"}, body
    assert isinstance(body["error"]["problems"], list)
    message: str = body["error"]["message"]
    return message


@pytest.mark.parametrize(("method", "path", "content_type", "body"), [
    ("PUT", "/v1alpha1/policies/p", JSON, DEEP_JSON),
    ("PUT", "/v1alpha1/policies/p", YAML, DEEP_JSON),
    ("PUT", "/v1alpha1/policies/p", YAML, DEEP_YAML),
    ("PUT", "/v1alpha1/policies/p", JSON, b'{"a":' * 500 + b"1" + b"}" * 500),
    ("POST", "/v1alpha1/sync", JSON, DEEP_JSON),
], ids=["put-json-100k", "put-yaml-flow-100k", "put-yaml-block-100k", "put-json-500",
        "sync-json-100k"])
def test_deep_bodies_are_a_400_naming_the_limit(server: Proc, method: str, path: str,
                                                content_type: str, body: bytes) -> None:
    """PUT and POST bodies nested past the limit: 400 in the error shape, nothing published."""
    r = httpx.request(method, f"{server.url}{path}", content=body, timeout=30,
                      headers={"content-type": content_type})
    assert f"more than {MAX_JSON_DEPTH} levels" in _error(r, 400)
    assert httpx.get(f"{server.url}/v1alpha1/generation").json()["generation"] == 0
    assert "Traceback" not in server.logs() and "unhandled" not in server.logs()


def test_yaml_aliases_are_refused(server: Proc) -> None:
    """A YAML alias (a document can contain itself through one) is a 400, not a 500."""
    r = httpx.put(f"{server.url}/v1alpha1/policies/p", content=ALIAS_YAML,
                  headers={"content-type": YAML})
    assert "aliases" in _error(r, 400)


def test_routes_that_read_no_body_ignore_a_deep_one(server: Proc) -> None:
    """GET and DELETE never decode a body: a deep one changes nothing about their answer."""
    for path in ("/v1alpha1/policies", "/v1alpha1/generation", "/v1alpha1/changes",
                 "/v1alpha1/dataplanes", "/healthz", "/readyz"):
        r = httpx.request("GET", f"{server.url}{path}", content=DEEP_JSON, timeout=30)
        assert r.status_code == 200, (path, r.text)
    r = httpx.request("DELETE", f"{server.url}/v1alpha1/policies/p", content=DEEP_JSON)
    _error(r, 404)  # not published


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1alpha1/no-such-route", 404), ("POST", "/v1alpha1/policies/p", 405),
    ("GET", "/v1alpha1/changes?since=abc", 400), ("GET", "/v1alpha1/policies/missing", 404)])
def test_routing_and_parameter_errors_use_the_same_shape(server: Proc, method: str,
                                                         path: str, status: int) -> None:
    """Unknown route, wrong method, bad query parameter, unknown policy: one error shape."""
    _error(httpx.request(method, f"{server.url}{path}"), status)
