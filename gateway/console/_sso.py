"""Single sign-on: the console signs a person in through an OIDC issuer, with the
authorization code grant and PKCE (S256), then makes the same server-side session as a
token sign-in (gateway/console/_session.py), whose subject is the person's role.

``GET /console/sso/{n}`` starts at the ``n``-th issuer whose ``roles.console`` is set:
a random flow value goes into a cookie (HttpOnly, ``SameSite=Lax`` so that the issuer's
redirect back carries it, 10 minutes, ``/console`` only) and the ``state``, ``nonce``
and PKCE ``code_verifier`` are HMACs of it — nothing is kept on the server, so the
callback may land on any worker or replica. The browser goes to the issuer's
``authorization_endpoint`` with the state, the nonce and the S256 challenge.

``GET /console/sso/callback`` checks ``state`` against the cookie's (constant time),
exchanges the code at the ``token_endpoint`` from this server (with the verifier, and
the client secret when one is configured), verifies the ID token with the issuer's keys
(:mod:`gateway.identity`: signature, ``iss``, ``aud`` — the console's client id must be
one of the issuer's ``audience`` —, ``exp``/``nbf``/``iat``) and its ``nonce``, reads the
role from its groups (:mod:`gateway.roles`), and starts a session. Each sign-in is one
audit line (user, role, issuer); no code, token, verifier or secret is logged, audited
or put in a URL of ours. The answer is a page that moves on to the console by itself:
the session cookie is ``SameSite=Strict``, which a browser withholds on the redirects
that follow another site's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
from typing import Any
from urllib.parse import urlencode

import httpx
from litestar import Request, Response, get
from litestar.params import FromPath

from gateway.admin import People, people_of
from gateway.config import resolve_secret
from gateway.console._session import (
    _cookie,
    expired,
    start_session,
)
from gateway.console._web import page
from gateway.errors import InferplaneError
from gateway.identity import IssuerSettings
from gateway.ingress import Gateway
from gateway.roles import ConsoleClient

log = logging.getLogger("mayu.console")
FLOW_COOKIE = "inferplane_console_sso"
FLOW_S = 600
CALLBACK = "/console/sso/callback"
AnyRequest = Request[Any, Any, Any]
_DISCOVERY = "console_sso_discovery"


def _derive(flow: str, purpose: bytes) -> str:
    digest = hmac.new(flow.encode(), purpose, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _redirect_uri(request: AnyRequest, client: ConsoleClient) -> str:
    return client.redirect_uri or f"{request.url.scheme}://{request.url.netloc}{CALLBACK}"


async def _endpoints(request: AnyRequest, issuer: IssuerSettings) -> dict[str, str]:
    """The issuer's ``authorization_endpoint`` and ``token_endpoint`` (its discovery
    document, fetched once per process)."""
    cache: dict[str, dict[str, str]] = request.app.state.setdefault(_DISCOVERY, {})
    found = cache.get(issuer.issuer)
    if found is None:
        url = issuer.issuer.rstrip("/") + "/.well-known/openid-configuration"
        async with httpx.AsyncClient(timeout=issuer.timeout_s) as client:
            r = await client.get(url, headers={"Accept": "application/json"})
        r.raise_for_status()
        doc = r.json()
        found = {k: str(doc[k]) for k in ("authorization_endpoint", "token_endpoint")}
        cache[issuer.issuer] = found
    return found


def _failed(request: AnyRequest, message: str, status: int = 401) -> Response[Any]:
    log.warning("console single sign-on refused: %s", message)
    answer = page(request, "error.html", {"message": f"Single sign-on failed: {message}.",
                                          "session": None}, status=status)
    answer.set_cookie(expired(request, FLOW_COOKIE))
    return answer


@get("/sso/{index:int}")
async def sso_start(request: AnyRequest, index: FromPath[int]) -> Response[Any]:
    """Off to the issuer's sign-in page, with state, nonce and the PKCE challenge."""
    found = people_of(request.app).console(index)
    if found is None:
        return _failed(request, f"no issuer {index} signs in to this console", 404)
    issuer, client = found
    try:
        endpoints = await _endpoints(request, issuer)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return _failed(request, f"the issuer's discovery document is unavailable ({exc})",
                       503)
    flow = f"{index}.{secrets.token_urlsafe(32)}"
    query = {"response_type": "code", "client_id": client.client_id,
             "redirect_uri": _redirect_uri(request, client), "scope": " ".join(client.scopes),
             "state": _derive(flow, b"state"), "nonce": _derive(flow, b"nonce"),
             "code_challenge": _challenge(_derive(flow, b"pkce")),
             "code_challenge_method": "S256"}
    answer: Response[Any] = Response(content=None, status_code=303, headers={
        "Location": f"{endpoints['authorization_endpoint']}?{urlencode(query)}"})
    answer.set_cookie(_cookie(request, FLOW_COOKIE, flow, max_age=FLOW_S, samesite="lax"))
    return answer


async def _exchange(request: AnyRequest, index: int, issuer: IssuerSettings,
                    client: ConsoleClient, code: str, verifier: str) -> str:
    """The ID token the issuer's token endpoint answers for ``code``."""
    form = {"grant_type": "authorization_code", "code": code, "client_id": client.client_id,
            "redirect_uri": _redirect_uri(request, client), "code_verifier": verifier}
    auth: httpx.Auth | None = None
    if client.client_secret_ref is not None:
        secret = resolve_secret(client.client_secret_ref, key=f"identity.issuers[{index}]"
                                ".roles.console.client_secret_ref")
        auth = httpx.BasicAuth(client.client_id, secret)
    endpoints = await _endpoints(request, issuer)
    async with httpx.AsyncClient(timeout=issuer.timeout_s) as http:
        r = await http.post(endpoints["token_endpoint"], data=form,
                            auth=auth if auth is not None else httpx.USE_CLIENT_DEFAULT,
                            headers={"Accept": "application/json"})
    if r.status_code != 200:
        raise ValueError(f"the issuer refused the code ({r.status_code})")
    token = r.json().get("id_token")
    if not isinstance(token, str):
        raise ValueError("the issuer answered no ID token")
    return token


@get("/sso/callback")
async def sso_callback(request: AnyRequest) -> Response[Any]:
    """Back from the issuer: state, code exchange, ID token and nonce, then a session."""
    flow = request.cookies.get(FLOW_COOKIE) or ""
    index, _, _ = flow.partition(".")
    people: People = people_of(request.app)
    found = people.console(int(index)) if index.isdigit() else None
    state = request.query_params.get("state") or ""
    if found is None or not hmac.compare_digest(state, _derive(flow, b"state")):
        return _failed(request, "this sign-in was not started here, or it expired "
                       "(state does not match): start again", 400)
    error = request.query_params.get("error")
    if error:  # the issuer's error code, reduced to its alphabet (it is logged)
        return _failed(request, "the issuer did not sign you in "
                       f"({re.sub(r'[^A-Za-z0-9_.-]', '', error)[:64]})")
    issuer, client = found
    try:
        id_token = await _exchange(request, int(index), issuer, client,
                                   request.query_params.get("code") or "",
                                   _derive(flow, b"pkce"))
        identity = await people.identity(id_token)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return _failed(request, str(exc), 502)
    except InferplaneError as exc:  # the ID token did not verify
        return _failed(request, exc.message)
    if not hmac.compare_digest(str(identity.claims.get("nonce") or ""),
                               _derive(flow, b"nonce")):
        return _failed(request, "the ID token is not for this sign-in (nonce)")
    role = people.role(identity)
    gw: Gateway = request.app.state.gateway
    gw.audit.write({"event": "console_sign_in", "method": "oidc", "issuer": role.issuer,
                    "user": role.user, "role": role.name, "teams": list(role.teams)})
    log.info("console: %s signed in through %s as %s", role.user, role.issuer, role.name)
    answer = page(request, "signed_in.html", {"session": None, "role": role})
    answer.set_cookie(await start_session(request, credential=role.subject(),
                                          subject=role.subject(), kind=role.tier))
    answer.set_cookie(expired(request, FLOW_COOKIE))
    return answer


ROUTES = [sso_start, sso_callback]
