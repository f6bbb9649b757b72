"""The admin API (``/admin/v1``) and its tokens: see :mod:`gateway.admin._routes`.

:data:`ROUTES` is one router holding every admin route: the access tiers are guards on
each route (:mod:`gateway.admin._access`), and the router carries the one exception
mapping (:mod:`gateway.admin._errors`: a failed store is a 503) and the ``caller`` and
``holder`` the guards let in.
"""

from litestar import Router

from gateway.admin._access import ACTING_AS, DEPENDENCIES, AdminAccess, AdminCaller
from gateway.admin._errors import EXCEPTION_HANDLERS
from gateway.admin._members import ROUTES as _MEMBERS
from gateway.admin._openapi import OPENAPI
from gateway.admin._operations import ROUTES as _OPERATIONS
from gateway.admin._people import People, people_of, revoked
from gateway.admin._revoke import ROUTES as _REVOKE
from gateway.admin._routes import ROUTES as _KEYS
from gateway.admin._usage import ROUTES as _USAGE

ROUTES = [Router(path="/",
                 route_handlers=[*_KEYS, *_MEMBERS, *_USAGE, *_OPERATIONS, *_REVOKE],
                 dependencies=DEPENDENCIES,
                 exception_handlers=EXCEPTION_HANDLERS)]

__all__ = ["ACTING_AS", "OPENAPI", "ROUTES", "AdminAccess", "AdminCaller", "People",
           "people_of", "revoked"]
