"""The admin API (``/admin/v1``) and its tokens: see :mod:`gateway.admin._routes`."""

from gateway.admin._access import AdminAccess, AdminCaller
from gateway.admin._openapi import OPENAPI
from gateway.admin._routes import ROUTES as _KEYS
from gateway.admin._usage import ROUTES as _USAGE

ROUTES = [*_KEYS, *_USAGE]

__all__ = ["OPENAPI", "ROUTES", "AdminAccess", "AdminCaller"]
