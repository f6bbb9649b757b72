"""The admin API against its own OpenAPI schema, on a real ``mayu serve`` process.

Schemathesis reads ``/admin/v1/openapi.json`` and drives every route with data generated
from it (valid and invalid bodies, parameters and headers): no answer is a 5xx, every
status is one the schema documents for that route, and every body matches the documented
schema (errors included: OpenAI's shape). With the read token, no write succeeds. 20
examples per route and token keep it near 20 s on this machine; the process is started
once for the module, on each profile (local, and shared on its own Postgres database).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from tests.conftest import create_database, drop_database, dsn_for
from tests.e2e._procs import Proc, start_gateway

Case = schemathesis.Case[Any]

pytestmark = pytest.mark.e2e

WRITE, READ = "contract-admin-write-token", "contract-admin-read-token"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module", params=["local", "shared"])
def served(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One ``mayu serve`` per profile: local (SQLite) and shared (a migrated Postgres
    database of its own)."""
    work = tmp_path_factory.mktemp(f"admin-contract-{request.param}")
    config = work / "mayu.yaml"
    doc: dict[str, Any] = {"data_dir": str(work), "server": {"admin_tokens": [
        {"name": "terraform", "token_ref": "env:IPT_ADMIN_WRITE", "access": "write"},
        {"name": "portal", "token_ref": "env:IPT_ADMIN_READ", "access": "read"}]}}
    env = {"IPT_ADMIN_WRITE": WRITE, "IPT_ADMIN_READ": READ}
    server_dsn = database = None
    if request.param == "shared":
        server_dsn = request.getfixturevalue("pg_server_dsn")
        database = f"ipt_{os.getpid()}_contract"
        create_database(server_dsn, database,
                        template=request.getfixturevalue("pg_template"))
        env["INFERPLANE_DATABASE_URL"] = dsn_for(server_dsn, database)
        doc |= {"key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
                "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                             "pool_max_size": 4}}
    config.write_text(yaml.safe_dump(doc))
    proc = start_gateway(config, env=env)
    try:
        # Something to find: a team and a key the generated paths may name.
        httpx.post(f"{proc.url}/admin/v1/teams", json={"name": "t"}, headers=bearer(WRITE))
        yield proc
    finally:
        proc.stop()
        if server_dsn is not None and database is not None:
            drop_database(server_dsn, database)


def _new_key(proc: Proc) -> str:
    r = httpx.post(f"{proc.url}/admin/v1/keys", json={"team": "t"}, headers=bearer(WRITE))
    assert r.status_code == 201, r.text
    secret: str = r.json()["secret"]
    return secret


@pytest.fixture(scope="module")
def holder(served: Proc) -> str:
    """A key of team ``t``: the key holder's routes (/v1/me…, /v1/usage) are driven with
    it, as the admin routes are with an admin token."""
    return _new_key(served)


@pytest.fixture(scope="module")
def revoked(served: Proc) -> str:
    """The key ``/v1/me/revoke`` is driven with (it revokes itself at its first valid
    call; the other key holder's routes keep theirs)."""
    return _new_key(served)


def _token(case: Case, admin: str, key: str, revoked: str) -> dict[str, str]:
    """The key on the key holder's routes, the admin token elsewhere."""
    if case.path == "/v1/me/revoke":
        return bearer(revoked)
    return bearer(key if case.path.startswith("/v1/") else admin)


def _each_operation(proc: Proc, check: Callable[[Case], object]) -> int:
    """Run ``check`` on 20 generated cases of every operation the schema lists (one
    Hypothesis run per operation, so a failure names its route); returns how many
    operations ran. The schemathesis pytest plugin is not used: it does not run on
    this pytest."""
    schema = schemathesis.openapi.from_url(f"{proc.url}/admin/v1/openapi.json")
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an Err raises here

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: Case) -> None:
            check(case)

        run()
        ran += 1
    return ran


def test_every_route_answers_as_its_schema_documents(served: Proc, holder: str,
                                                     revoked: str) -> None:
    """No 5xx, every status documented for its route, every body (errors included)
    matching the documented schema, invalid input refused, with the write token (and the
    key on the key holder's routes).

    Not checked: that every schema-valid input is accepted. JSON Schema calls 51.0 an
    integer and any string a date-time unless a validator enforces ``format``; the API
    (msgspec) refuses both with a 400, which is the answer we want."""
    assert _each_operation(served, lambda case: case.call_and_validate(
        headers=_token(case, WRITE, holder, revoked),
        excluded_checks=[positive_data_acceptance])) == 42


def test_a_read_token_writes_nothing(served: Proc) -> None:
    """With the read token every write is refused (403, or 400 when the input is
    malformed before the token is looked at), nothing is a 5xx."""
    def check(case: Case) -> None:
        response = case.call(headers=bearer(READ))
        assert response.status_code < 500, response.text
        if case.method.upper() != "GET" and not case.path.startswith("/v1/me"):
            assert response.status_code in (400, 403), (case.method, case.path,
                                                        response.text)
    assert _each_operation(served, check) == 42


def test_the_schema_lists_every_admin_route(served: Proc) -> None:
    """The document is served without a token (it holds no data) as JSON, declares its
    bearer scheme for every operation, and names each route, the key holder's too."""
    r = httpx.get(f"{served.url}/admin/v1/openapi.json")
    assert r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert doc["info"]["title"] == "inferplane admin API"
    assert doc["components"]["securitySchemes"] == {"bearer": {
        "type": "http", "scheme": "bearer", "description": doc["components"][
            "securitySchemes"]["bearer"]["description"]}}
    assert doc["security"] == [{"bearer": []}]
    for item in doc["paths"].values():
        for operation in item.values():
            assert operation.get("security", doc["security"]) == [{"bearer": []}]
    assert set(doc["paths"]) == {
        "/admin/v1/teams", "/admin/v1/teams/{team}", "/admin/v1/teams/{team}/limits",
        "/admin/v1/keys", "/admin/v1/keys/{key_id}", "/admin/v1/keys/{key_id}/revoke",
        "/admin/v1/keys/{key_id}/rotate", "/v1/me/revoke", "/admin/v1/requests",
        "/admin/v1/requests.csv", "/admin/v1/requests/summary", "/v1/me/requests",
        "/v1/me/requests.csv", "/v1/me/requests/summary", "/admin/v1/requests/{permit_id}",
        "/v1/me/requests/{permit_id}", "/admin/v1/permits",
        "/admin/v1/permits/{permit_id}/resolve", "/admin/v1/frozen",
        "/admin/v1/frozen/unfreeze", "/admin/v1/status", "/admin/v1/alerts",
        "/admin/v1/teams/{team}/members", "/admin/v1/teams/{team}/members/{user}",
        "/admin/v1/teams/{team}/default-member", "/admin/v1/users", "/admin/v1/users/{user}",
        "/admin/v1/users/{user}/revoke", "/admin/v1/users/{user}/reinstate",
        "/v1/me", "/v1/usage", "/admin/v1/agent-usage", "/v1/me/agent-usage"}


def test_the_audit_names_only_the_write_token(served: Proc) -> None:
    """Run after the generated cases (file order): every admin write in the audit file
    names the write token, ``terraform``; the read token, ``portal``, wrote nothing (a
    key's revocation of itself names no admin token)."""
    data_dir = served.log_path.parent  # the config's data_dir
    # Split on "\n" only: a generated user name may hold U+2028 or U+0085, which the
    # audit line carries raw (valid JSON) and str.splitlines() would split on.
    lines = [json.loads(x) for f in sorted(data_dir.glob("audit-*.jsonl"))
             for x in f.read_text().split("\n") if x.strip()]
    tokens = {x.get("token") for x in lines if x.get("event") == "admin"
              and x.get("action") != "key.revoke_self"}  # a key holder's, no admin token
    assert tokens == {"terraform"}, tokens


NUL_CASES = ["/admin/v1/requests/summary?team=a%00b", "/admin/v1/requests?model=a%00b",
             "/admin/v1/requests.csv?client=a%00b", "/admin/v1/teams/a%00b",
             "/admin/v1/keys?team=a%00b", "/admin/v1/requests/a%00b",
             "/admin/v1/teams/t/members/a%00b", "/admin/v1/users/a%00b",
             "/v1/me/requests?model=a%00b", "/v1/me/requests/summary?team=a%00b",
             "/v1/me/requests/a%00b", "/admin/v1/permits?cursor=a%00b",
             "/v1/usage?day=a%00b"]


def test_a_nul_byte_in_a_filter_or_a_path_is_a_400(served: Proc, holder: str) -> None:
    """A NUL byte (``%00``) in a query parameter or a path parameter is a 400 in
    OpenAI's shape naming it, on every profile (Postgres text cannot hold one: it was a
    500 or a 503 on the shared profile), so is one in an operator's free text (a
    resolution's reason, a counter's name), and nothing is logged as a store failure."""
    for path in NUL_CASES:
        token = holder if path.startswith("/v1/me") else READ
        r = httpx.get(f"{served.url}{path}", headers=bearer(token))
        assert r.status_code == 400, (path, r.status_code, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and "NUL" in error["message"], error
        assert error["param"] == ("path" if "?" not in path else path.split("?")[1][:-6])
    for path, body in (("/admin/v1/frozen/unfreeze", {"counter": "a\u0000b"}),
                       ("/admin/v1/permits/00000000000000000000000000000000/resolve",
                        {"as": "uncertain", "reason": "a\u0000b"})):
        r = httpx.post(f"{served.url}{path}", json=body, headers=bearer(WRITE))
        assert r.status_code == 400, (path, r.status_code, r.text)
    assert "unavailable" not in served.logs() and "Traceback" not in served.logs()
