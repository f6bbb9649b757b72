"""The admin API (``/admin/v1``) and its tokens: see :mod:`gateway.admin._routes`."""

from gateway.admin._access import AdminAccess, AdminCaller
from gateway.admin._members import ROUTES as _MEMBERS
from gateway.admin._openapi import OPENAPI
from gateway.admin._operations import ROUTES as _OPERATIONS
from gateway.admin._routes import ROUTES as _KEYS
from gateway.admin._usage import ROUTES as _USAGE

ROUTES = [*_KEYS, *_MEMBERS, *_USAGE, *_OPERATIONS]

__all__ = ["OPENAPI", "ROUTES", "AdminAccess", "AdminCaller"]
