"""What the admin API's and console's tests share: the admin tokens, the ``Authorization``
header, and a gateway's settings on either profile (the ``admin`` fixture in
``conftest.py`` is a client of them; other suites put their settings on a profile with
:func:`on_profile`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from gateway.config import (
    AdminToken,
    DatabaseSettings,
    GovernanceStoreSettings,
    KeyStoreSettings,
    Settings,
    load_settings,
)

WRITE, READ = "w" * 8 + "-admin-write-token", "r" * 8 + "-admin-read-token"
ADMIN_TOKENS = {"terraform": ("write", WRITE), "portal": ("read", READ)}


SHARED_STORES: dict[str, Any] = {
    "key_store": KeyStoreSettings(type="postgres"),
    "governance_store": GovernanceStoreSettings(type="postgres"),
    "database": DatabaseSettings(pool_min_size=1, pool_max_size=2)}
"""A shared-profile gateway's store settings (``Settings(**SHARED_STORES)``, or
``replace``): both stores on the database ``INFERPLANE_DATABASE_URL`` names."""


def on_profile(request: pytest.FixtureRequest, settings: Settings, profile: str) -> Settings:
    """``settings`` as they are (``local``), or (``shared``) with :data:`SHARED_STORES` on
    the test's fresh migrated database (``pg_dsn``)."""
    if profile != "shared":
        return settings
    request.getfixturevalue("monkeypatch").setenv(
        "INFERPLANE_DATABASE_URL", request.getfixturevalue("pg_dsn"))
    return replace(settings, **SHARED_STORES)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def gateway_settings(request: pytest.FixtureRequest, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch, *, profile: str,
                     tokens: dict[str, tuple[str, str]] | None = None) -> Settings:
    """A gateway's settings on ``profile`` (``local`` or ``shared``) with ``tokens``
    (name -> (access, secret); default :data:`ADMIN_TOKENS`)."""
    admin_tokens = []
    named = ADMIN_TOKENS if tokens is None else tokens
    for i, (name, (access, secret)) in enumerate(named.items()):
        monkeypatch.setenv(f"IPT_ADMIN_TOKEN_{i}", secret)
        admin_tokens.append(AdminToken(name=name, token_ref=f"env:IPT_ADMIN_TOKEN_{i}",
                                       access=access))  # type: ignore[arg-type]
    base = load_settings(None)  # the built-in mock models
    server = replace(base.server, audit_path=str(tmp_path / "audit.jsonl"),
                     admin_tokens=admin_tokens)
    settings = replace(base, data_dir=str(tmp_path), demo=False, server=server)
    if profile == "shared":
        # Replayable rotations need the secret they are derived with (all replicas').
        monkeypatch.setenv("IPT_ROTATION_SECRET", "r" * 40)
        settings = replace(settings, server=replace(
            settings.server, rotation_secret_ref="env:IPT_ROTATION_SECRET"))
    return on_profile(request, settings, profile)
