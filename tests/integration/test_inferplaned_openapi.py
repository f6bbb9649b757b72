"""inferplaned's OpenAPI document (``GET /v1alpha1/openapi.json``) against a real migrated
Postgres (Litestar test client): served as JSON without a token, every route documented
with its bearer scheme, and a document whose structure holds (openapi-spec-validator is
not a dependency: every ``$ref`` resolves, every schema is valid JSON Schema 2020-12 by
schemathesis's own validator, jsonschema_rs, and schemathesis loads every operation)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import jsonschema_rs  # schemathesis's own validator
import pytest
import schemathesis
from litestar.testing import AsyncTestClient

from controlplane import create_app
from controlplane.settings import AuthSettings, ControlPlaneConfig
from gateway.config import DatabaseSettings

pytestmark = pytest.mark.integration
DIALECT = "https://json-schema.org/draft/2020-12/schema"

ROUTES = {"/v1alpha1/policies/{name}": {"get", "put", "delete"},
          "/v1alpha1/policies": {"get"}, "/v1alpha1/generation": {"get"},
          "/v1alpha1/changes": {"get"}, "/v1alpha1/sync": {"post"},
          "/v1alpha1/dataplanes": {"get"}, "/metrics": {"get"}, "/healthz": {"get"},
          "/readyz": {"get"}, "/v1alpha1/token": {"post"}, "/v1alpha1/jwks.json": {"get"},
          "/v1alpha1/users/{name}/revoke": {"post"},
          "/v1alpha1/users/{name}/reinstate": {"post"},
          "/v1alpha1/credentials": {"post"}, "/v1alpha1/usage": {"post"},
          "/v1alpha1/teams/{team}/keys": {"post"}, "/v1alpha1/keys/{key_id}/revoke": {"post"}}
OPEN = ("/healthz", "/readyz", "/v1alpha1/token", "/v1alpha1/jwks.json")


@pytest.fixture
async def document(pg_dsn: str, monkeypatch: pytest.MonkeyPatch
                   ) -> AsyncIterator[tuple[dict[str, str], dict[str, Any]]]:
    """(the answer's headers, the document) of a running inferplaned."""
    monkeypatch.setenv("IPD_OA_DSN", pg_dsn)
    monkeypatch.setenv("IPD_OA_WRITER", "w" * 24)
    config = ControlPlaneConfig(
        database=DatabaseSettings(dsn_ref="env:IPD_OA_DSN", pool_min_size=1,
                                  pool_max_size=2),
        auth=AuthSettings(writer_tokens_ref={"ci": "env:IPD_OA_WRITER"}))
    async with AsyncTestClient(app=create_app(config)) as client:
        r = await client.get("/v1alpha1/openapi.json")
        assert r.status_code == 200, r.text
        yield dict(r.headers), r.json()


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


async def test_the_document_is_json_names_every_route_and_its_bearer_scheme(
        document: tuple[dict[str, str], dict[str, Any]]) -> None:
    """Served as application/json with no token; every route and method is in it, each
    operation asks the bearer scheme (the health probes none) and documents its errors
    in inferplaned's one shape; the two bodies read by hand are described."""
    headers, doc = document
    assert headers["content-type"].startswith("application/json")
    assert doc["openapi"].startswith("3.1") and doc["info"]["title"] == "inferplaned API"
    assert {p: set(item) for p, item in doc["paths"].items()} == ROUTES
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["security"] == [{"bearer": []}]
    for path, item in doc["paths"].items():
        for operation in item.values():
            want = [{}] if path in OPEN else [{"bearer": []}]
            assert operation.get("security", doc["security"]) == want, path
            assert operation["responses"]["4XX"]["content"]["application/json"][
                "schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    put = doc["paths"]["/v1alpha1/policies/{name}"]["put"]["requestBody"]["content"]
    assert set(put) == {"application/json", "application/yaml"}
    sync = doc["paths"]["/v1alpha1/sync"]["post"]
    assert sync["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SyncRequest"}


async def test_the_document_is_structurally_valid(
        document: tuple[dict[str, str], dict[str, Any]]) -> None:
    """Every $ref names a schema the document holds, every schema is valid JSON Schema
    (2020-12, OpenAPI 3.1's dialect), and schemathesis loads each operation."""
    _, doc = document
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas
    for schema in schemas.values():
        jsonschema_rs.meta.validate({"$schema": DIALECT, **schema})
    loaded = schemathesis.openapi.from_dict(doc)
    operations = [r.ok() for r in loaded.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) == sum(len(m) for m in ROUTES.values())
