"""The admin API (``/admin/v1``) and its tokens: see :mod:`gateway.admin._routes`."""

from gateway.admin._access import AdminAccess, AdminCaller
from gateway.admin._openapi import OPENAPI
from gateway.admin._routes import ROUTES

__all__ = ["OPENAPI", "ROUTES", "AdminAccess", "AdminCaller"]
