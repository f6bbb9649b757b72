"""The console's one data source: the admin API and the key routes, called over HTTP.

Every figure on a console page comes from the same route a script would call
(``/admin/v1/...``, ``/v1/me``), in-process through httpx's ASGI transport against the
running app, so the console can never disagree with the API: the same handlers, the
same access checks (a read token's write is the API's 403), the same errors. A signed-in
visitor's calls act for their session's credential by its digest (``ActingFor`` in the
ASGI scope, which no client can set; the console keeps no credential), a person's for
their role (``ACTING_AS``); only the
sign-in's own check carries the credential, as ``Authorization: Bearer``, never in a URL.

httpx logs every request it sends at INFO; these never leave the process (a page makes
four to seven), so its log lines for them are dropped (:class:`_InProcessCalls`) while
its lines for the providers' calls stay as they are.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import httpx
from litestar import Litestar

from gateway.admin import ACTING_AS
from gateway.ingress import ACTING_FOR, ActingFor
from gateway.roles import Role

_HOST = "console.inferplane.internal"
_BASE = f"http://{_HOST}"


class _InProcessCalls(logging.Filter):
    """Drops httpx's per-request log line for a call to the console's own base URL."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(a, httpx.URL) and a.host == _HOST for a in args)


logging.getLogger("httpx").addFilter(_InProcessCalls())


@dataclass(frozen=True)
class Answer:
    """One API answer: status, the JSON body (or the text of a non-JSON one), headers."""

    status: int
    body: Any
    headers: httpx.Headers

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error(self) -> dict[str, Any]:
        """The API's ``{"error": {message, param, code}}`` (empty for a success)."""
        if self.ok or not isinstance(self.body, dict):
            return {}
        detail = self.body.get("error")
        return detail if isinstance(detail, dict) else {}

    @property
    def message(self) -> str:
        text = self.error.get("message")
        return str(text) if text else f"the API answered {self.status}"


class Api:
    """The API as one credential's holder sees it: a session's (``acting``), or the one
    presented at sign-in (``credential``)."""

    def __init__(self, app: Litestar, *, acting: ActingFor | None = None,
                 credential: str | None = None, role: Role | None = None) -> None:
        self._app = app
        self._acting = acting
        self._credential = credential
        self._role = role

    async def _asgi(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if self._role is not None:  # a person signed in through an issuer: their role
            scope = {**scope, ACTING_AS: self._role}
        elif self._acting is not None:
            scope = {**scope, ACTING_FOR: self._acting}
        await self._app(scope, receive, send)  # type: ignore[arg-type]

    async def call(self, method: str, path: str, *, params: dict[str, str] | None = None,
                   json: Any = None, headers: dict[str, str] | None = None) -> Answer:
        sent = dict(headers or {})
        if self._credential is not None:
            sent["Authorization"] = f"Bearer {self._credential}"
        transport = httpx.ASGITransport(app=self._asgi)
        async with httpx.AsyncClient(transport=transport, base_url=_BASE) as client:
            r = await client.request(method, path, params=params, json=json, headers=sent)
        try:
            body: Any = r.json()
        except ValueError:
            body = r.text
        return Answer(r.status_code, body, r.headers)

    async def get(self, path: str, **params: str | None) -> Answer:
        return await self.call("GET", path, params=_present(params))

    async def text(self, path: str, **params: str | None) -> tuple[int, str]:
        """A non-JSON answer (the CSV export) as it is."""
        answer = await self.call("GET", path, params=_present(params))
        body = answer.body if isinstance(answer.body, str) else ""
        return answer.status, body

    async def every(self, path: str, **params: str | None) -> list[dict[str, Any]]:
        """Every item of a paged list (``data`` + ``next_cursor``); :class:`ApiRefused`
        if refused."""
        items, _ = await self.every_with_first(path, **params)
        return items

    async def every_with_first(self, path: str, **params: str | None
                               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every item of a paged list, and the first page's answer (for the fields a
        list carries beside its items, e.g. a team's default member budget)."""
        items: list[dict[str, Any]] = []
        first: dict[str, Any] | None = None
        cursor: str | None = None
        while True:
            answer = await self.get(path, cursor=cursor, limit="500", **params)
            if not answer.ok:
                raise ApiRefused(answer)
            first = answer.body if first is None else first
            items.extend(answer.body["data"])
            cursor = answer.body.get("next_cursor")
            if not cursor:
                return items, first


class ApiRefused(Exception):
    """The API refused a read a page needs (its message is shown on the page)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.message)
        self.answer = answer


def _present(params: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in params.items() if v not in (None, "")}
