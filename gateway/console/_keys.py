"""Keys: list (with the API's filters, each key's last use and its spend today and this
month from the summary API grouped by key), create, rotate with grace, revoke.

A new or rotated key's secret is in the one answer that created it (as in the API):
rendered once on a page marked ``Cache-Control: no-store``, with a copy button and the
lines Claude Code and Codex need; it is never put in a URL, a redirect or a log line.
A rotation form carries a random Idempotency-Key made when it was drawn, so submitting
it twice rotates once. A revocation sends the revision the page showed (``If-Match``).
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import quote, urlencode

from litestar import Request, Response, post
from litestar.params import FromPath
from litestar.response import Redirect

from gateway.console._client import Answer, Api
from gateway.console._forms import (
    KEY_LIMITS,
    LABELS,
    NotAWholeNumber,
    field_of,
    limits,
    text,
    whole_number,
)
from gateway.console._spend import spend_by
from gateway.console._web import admin_page, page, writer

AnyRequest = Request[Any, Any, Any]
_KEY_FIELDS = ("team", "name", "user", "allowed_models", *KEY_LIMITS)
_STATUSES = ("active", "revoked", "expired")


async def _keys(request: AnyRequest, session: Any, api: Api, *,
                errors: dict[str, str] | None = None, values: Any = None,
                status: int = 200) -> Response[Any]:
    q = request.query_params
    chosen = {"team": q.get("team") or "", "status": q.get("status") or "",
              "user": q.get("user") or ""}
    teams = await api.every("/admin/v1/teams")
    listed = await api.get("/admin/v1/keys", limit="500", cursor=q.get("cursor"),
                           **{k: v for k, v in chosen.items() if v})
    return page(request, "keys.html", {
        "session": session, "teams": teams, "names": {t["id"]: t["name"] for t in teams},
        "keys": listed.body["data"] if listed.ok else [],
        "next_cursor": listed.body.get("next_cursor") if listed.ok else None,
        "list_error": None if listed.ok else listed.message, "chosen": chosen,
        "statuses": _STATUSES, "fields": KEY_LIMITS, "labels": LABELS,
        "errors": errors or {}, "values": values or {},
        "rotation_id": secrets.token_hex(16), "flash": q.get("flash"),
        "query": urlencode({k: v for k, v in chosen.items() if v}),
        "spend": (await spend_by(api, "key", team=chosen["team"] or None)
                  if listed.ok else {})}, status=status)


@post("/keys", status_code=200)
async def create_key(request: AnyRequest) -> Response[Any]:
    session, api, form = await writer(request)
    errors: dict[str, str] = {}
    body: dict[str, Any] = {"team": text(form, "team"), "name": text(form, "name"),
                            "limits": {k: v for k, v in limits(form, KEY_LIMITS,
                                                               errors).items()
                                       if v is not None}}
    if not body["team"]:
        errors["team"] = "choose a team"
    if text(form, "user"):
        body["user"] = text(form, "user")
    models = [m.strip() for m in text(form, "allowed_models").split(",") if m.strip()]
    if models:
        body["allowed_models"] = models
    if not errors:
        answer = await api.call("POST", "/admin/v1/keys", json=body)
        if answer.ok:
            return await _secret(request, session, api, answer, rotated=False)
        errors[field_of(answer.error.get("param"), _KEY_FIELDS)] = answer.message
    return await _keys(request, session, api, errors=errors, values=form, status=400)


@post("/keys/{key_id:str}/rotate", status_code=200)
async def rotate_key(request: AnyRequest, key_id: FromPath[str]) -> Response[Any]:
    session, api, form = await writer(request)
    try:
        grace = whole_number(text(form, "grace_seconds") or "86400")
    except NotAWholeNumber:
        return Redirect(f"/console/keys?flash=bad_grace:{key_id}", status_code=303)
    answer = await api.call("POST", f"/admin/v1/keys/{quote(key_id, safe='')}/rotate",
                            json={"grace_seconds": grace},
                            headers={"Idempotency-Key": text(form, "rotation_id")
                                     or secrets.token_hex(16)})
    if not answer.ok:
        return page(request, "error.html", {"session": session, "message": answer.message},
                    status=answer.status)
    return await _secret(request, session, api, answer, rotated=True)


@post("/keys/{key_id:str}/revoke", status_code=303)
async def revoke_key(request: AnyRequest, key_id: FromPath[str]) -> Response[Any]:
    session, api, form = await writer(request)
    answer = await api.call("POST", f"/admin/v1/keys/{quote(key_id, safe='')}/revoke",
                            headers={"If-Match": f'"{text(form, "revision")}"'})
    if not answer.ok:
        return page(request, "error.html", {"session": session, "message": answer.message},
                    status=answer.status)
    return Redirect(f"/console/keys?flash=revoked:{key_id}", status_code=303)


async def _secret(request: AnyRequest, session: Any, api: Api, answer: Answer, *,
                  rotated: bool) -> Response[Any]:
    """The one page that shows a secret: never cached, never stored. The key's team by
    its name (its id when the team cannot be read)."""
    base = str(request.base_url).rstrip("/")
    team_id = answer.body["key"]["team_id"]
    team = await api.get(f"/admin/v1/teams/{quote(team_id, safe='')}")
    shown = page(request, "secret.html", {
        "session": session, "key": answer.body["key"], "secret": answer.body["secret"],
        "team_name": team.body["name"] if team.ok else team_id,
        "rotated": rotated, "previous_valid_until": answer.body.get("previous_valid_until"),
        "base_url": base}, status=201 if not rotated else 200)
    shown.headers["Cache-Control"] = "no-store"
    return shown


ROUTES = [admin_page("/keys", _keys), create_key, rotate_key, revoke_key]
