"""Standalone mode, and the warning it carries (ADR-031).

A ``mayu`` in the local profile — virtual keys made by hand in this node's own SQLite
file — with no control plane (``control_plane``) and no OIDC issuer to tie a request to
a person is *standalone*: fine for a workstation or a demo, not for production (a key
outlives the person it was made for; nothing revokes it when they leave; the budgets
stop at this node). ADR-031 lets it run, on the condition that it says so at runtime.

It says so in three places, all from :func:`standalone_warning`: one WARNING line when
the server starts (``mayu`` logger; one line per ``mayu serve``, not one per worker),
``/readyz``'s ``detail``, and ``GET /admin/v1/status``'s ``warning``, which the
console's Operations page shows. It refuses nothing: the demo keeps working.
"""

from __future__ import annotations

from gateway.config import Settings

WARNING = ("Standalone mode (local keys, no control plane, no OIDC issuer) is not "
           "recommended for production: keys are made by hand and tied to no person, "
           "budgets end at this node; configure control_plane or identity issuers "
           "(docs/profiles.md)")


def standalone(settings: Settings) -> bool:
    """Whether ``settings`` run standalone: the local profile (keys in this node's SQLite
    file), no control plane, and no OIDC issuer."""
    return (not settings.shared and settings.control_plane is None
            and not _issuers(settings))


def standalone_warning(settings: Settings) -> str | None:
    """The standalone warning, or None when ``settings`` are not standalone."""
    return WARNING if standalone(settings) else None


def _issuers(settings: Settings) -> bool:
    """Whether ``identity`` names an OIDC issuer or inferplaned's credentials."""
    identity = settings.identity
    return identity is not None and (bool(identity.issuers) or identity.broker is not None)
