"""The console (``/console``): operators and key holders see spend, budgets, keys and
requests in a browser — server-rendered pages over the admin API (docs/console.md).

:data:`ROUTES` goes into the app's route handlers and :data:`TEMPLATES` is its template
config; the pages, static assets and templates ship in the package (no CDN, no build).
"""

from gateway.console._routes import ROUTES, TEMPLATES

__all__ = ["ROUTES", "TEMPLATES"]
