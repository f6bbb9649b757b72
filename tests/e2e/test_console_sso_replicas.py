"""Console single sign-on across two shared-profile replicas (real ``mayu serve`` processes
on one Postgres database, the tests' OIDC provider, Debian's Chromium).

The sign-in starts on one replica and the issuer sends the browser back to the other
(its ``redirect_uri``): the flow keeps nothing on a server, so the second replica
finishes it, and the session it makes (in the shared database) is answered by the first
too; a sign-out on the first ends it on the second. Revoking a person through one
replica's admin API signs them out on the other at their next page.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import cloned_database
from tests.e2e._browser import chromium
from tests.e2e._controlplane import shared_gateway_config
from tests.e2e._oidc import OidcProvider
from tests.e2e._procs import Proc, start_gateway

pytestmark = pytest.mark.e2e


def _identity(oidc: OidcProvider, redirect_uri: str | None) -> dict[str, Any]:
    console: dict[str, Any] = {"client_id": "mayu-console", "name": "Example IdP"}
    if redirect_uri is not None:
        console["redirect_uri"] = redirect_uri
    return {"identity": {"issuers": [{"issuer": oidc.issuer, "audience": ["mayu-console"],
                                      "roles": {"admin": ["admins"], "console": console}}]}}


@pytest.fixture(scope="module")
def replicas(oidc: OidcProvider, tmp_path_factory: pytest.TempPathFactory,
             pg_server_dsn: str, pg_template: str) -> Iterator[list[Proc]]:
    """Two replicas on the module's database: the second finishes sign-ins (its own
    callback); the first sends its visitors' sign-ins back to the second's callback."""
    work = tmp_path_factory.mktemp("sso-replicas")
    with cloned_database(pg_server_dsn, pg_template, "sso_replicas") as dsn:
        env = {"INFERPLANE_DATABASE_URL": dsn}
        second = start_gateway(shared_gateway_config(work, "r2", extra=_identity(oidc, None)),
                               env=env)
        try:
            first = start_gateway(shared_gateway_config(work, "r1", extra=_identity(
                oidc, f"{second.url}/console/sso/callback")), env=env)
            try:
                yield [first, second]
            finally:
                first.stop()
        finally:
            second.stop()


def _signed_in(browser: Any, oidc: OidcProvider, who: str, start: Proc,
               finish: Proc) -> Any:
    """A fresh browser's page signed in as admin ``who`` (``adm-N``): started on
    ``start``'s sign-in page, finished on ``finish``'s Overview."""
    oidc.sign_in(who, email=f"{who.replace('-', '')}@example.com", groups=["admins"])
    context = browser.new_context()
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto(f"{start.url}/console/login")
    page.get_by_role("link", name="Sign in with Example IdP").click()
    page.wait_for_url(re.compile(re.escape(finish.url) + r"/console/overview$"))
    return page


def test_a_sign_in_started_on_one_replica_is_finished_and_kept_by_the_other(
        replicas: list[Proc], oidc: OidcProvider) -> None:
    """Started on r1, finished on r2 (r2's page), answered on r1 too; signed out on r1,
    signed out on r2."""
    first, second = replicas
    with chromium() as browser:
        page = _signed_in(browser, oidc, "adm-9", first, second)
        page.goto(f"{first.url}/console/overview")
        assert page.url == f"{first.url}/console/overview"
        assert page.get_by_test_id("who").inner_text() == "adm9@example.com (admin)"
        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url(re.compile(r"/console/login$"))
        page.goto(f"{second.url}/console/overview")
        assert page.url == f"{second.url}/console/login"
        page.context.close()


def test_revoking_a_person_signs_them_out_on_every_replica(
        replicas: list[Proc], oidc: OidcProvider) -> None:
    """A person signed in on r2 is revoked through r1's admin API (by another admin's
    bearer): their next page on r2 is the sign-in form, and their bearer is refused."""
    first, second = replicas
    other = {"Authorization": "Bearer " + oidc.token(
        "adm-8", email="adm8@example.com", groups=["admins"], aud="mayu-console")}
    made = httpx.put(f"{first.url}/admin/v1/users/adm7@example.com",
                     headers={**other, "If-Match": '"0"'}, json={"limits": {}})
    assert made.status_code == 201, made.text
    with chromium() as browser:
        page = _signed_in(browser, oidc, "adm-7", second, second)
        revoked = httpx.post(f"{first.url}/admin/v1/users/adm7@example.com/revoke",
                             headers=other)
        assert revoked.status_code == 200, revoked.text
        page.goto(f"{second.url}/console/overview")
        assert page.url == f"{second.url}/console/login"
        page.context.close()
    own = oidc.token("adm-7", email="adm7@example.com", groups=["admins"],
                     aud="mayu-console")
    r = httpx.get(f"{second.url}/admin/v1/teams", headers={"Authorization": f"Bearer {own}"})
    assert r.status_code == 403 and "revoked" in r.text
