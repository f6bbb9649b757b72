"""The console's routes under ``/console``, their headers, static files and templates.

Every page answers ``Cache-Control: no-store`` (they show spend and keys) and a
Content-Security-Policy that lets a page load nothing from outside the gateway and run
no inline script; bars are inline SVG, so no inline style is needed either. The
console's routes are not in the admin API's OpenAPI schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader
from litestar import Request, Response, Router
from litestar.config.compression import CompressionConfig
from litestar.datastructures import ResponseHeader
from litestar.middleware import DefineMiddleware
from litestar.middleware.compression import CompressionMiddleware
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig

from gateway.console import (
    _admin,
    _auth,
    _keys,
    _me,
    _members,
    _mine,
    _operations,
    _requests,
    _sso,
    _usage,
    _users,
)
from gateway.console._client import ApiRefused
from gateway.console._format import FILTERS
from gateway.console._session import current
from gateway.console._web import Detour, detour, load_session, page

AnyRequest = Request[Any, Any, Any]
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = [ResponseHeader(name="Cache-Control", value="no-store"),
           ResponseHeader(name="Content-Security-Policy", value=CSP),
           ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
           ResponseHeader(name="X-Frame-Options", value="DENY"),
           ResponseHeader(name="Referrer-Policy", value="no-referrer")]


def _refused(request: AnyRequest, exc: Exception) -> Response[Any]:
    assert isinstance(exc, ApiRefused)
    return page(request, "error.html", {"session": current(request),
                                        "message": exc.answer.message},
                status=exc.answer.status)


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("gateway.console", "templates"),
                      autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(FILTERS)
    return env


TEMPLATES = TemplateConfig(instance=JinjaTemplateEngine.from_environment(_environment()))
PAGES = Router(path="/", route_handlers=[*_auth.ROUTES, *_admin.ROUTES, *_members.ROUTES,
                                         *_users.ROUTES, *_keys.ROUTES,
                                         *_requests.ROUTES, *_me.ROUTES,
                                         *_usage.ROUTES, *_operations.ROUTES,
                                         *_sso.ROUTES, *_mine.ROUTES],
               response_headers=HEADERS, before_request=load_session,
               exception_handlers={Detour: detour, ApiRefused: _refused})
# The assets hold no secret and no visitor input, so they may be compressed (htmx: 50 kB
# → 16 kB); the pages are not: they carry CSRF tokens beside reflected filters (BREACH).
STATIC = create_static_files_router(
    path="/static", directories=[Path(__file__).parent / "static"], name="console-static",
    include_in_schema=False, middleware=[DefineMiddleware(
        CompressionMiddleware, config=CompressionConfig(backend="gzip", minimum_size=500))])
ROUTES = [Router(path="/console", route_handlers=[PAGES, STATIC], include_in_schema=False)]
