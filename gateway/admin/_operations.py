"""Placeholder: filled by the operations work (issue 27/28)."""

from litestar.handlers import HTTPRouteHandler

ROUTES: list[HTTPRouteHandler] = []
