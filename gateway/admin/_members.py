"""Placeholder: filled by the members work (issue 27/28)."""

from litestar.handlers import HTTPRouteHandler

ROUTES: list[HTTPRouteHandler] = []
