"""inferplaned's config for an in-process test client: a database and named tokens.

Each token is given by its secret; :func:`control_plane_config` puts the secret in an
environment variable of the test (``monkeypatch``) and the config refers to it, as an
operator's would.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from controlplane.settings import AuthSettings, ControlPlaneConfig, DataPlaneToken
from gateway.config import DatabaseSettings

PlaneSpec = str | tuple[str, dict[str, Any]]
"""A data-plane token: its secret, or (secret, DataPlaneToken's other fields)."""


def control_plane_config(monkeypatch: pytest.MonkeyPatch, dsn: str, *,
                         writers: dict[str, str], readers: dict[str, str] | None = None,
                         planes: dict[str, PlaneSpec] | None = None,
                         **sections: Any) -> ControlPlaneConfig:
    """inferplaned on ``dsn`` (a pool of 2) with these tokens (name -> secret);
    ``sections``: more of the config (e.g. ``lease=LeaseSettings(...)``)."""
    numbers = itertools.count()

    def ref(secret: str) -> str:
        var = f"IPD_TEST_SECRET_{next(numbers)}"
        monkeypatch.setenv(var, secret)
        return f"env:{var}"

    def plane(spec: PlaneSpec) -> str | DataPlaneToken:
        if isinstance(spec, str):
            return ref(spec)
        secret, fields = spec
        return DataPlaneToken(token_ref=ref(secret), **fields)

    monkeypatch.setenv("IPD_TEST_DSN", dsn)
    return ControlPlaneConfig(
        database=DatabaseSettings(dsn_ref="env:IPD_TEST_DSN", pool_min_size=1,
                                  pool_max_size=2),
        auth=AuthSettings(
            writer_tokens_ref={name: ref(s) for name, s in writers.items()},
            reader_tokens_ref={name: ref(s) for name, s in (readers or {}).items()},
            dataplane_tokens_ref={name: plane(s) for name, s in (planes or {}).items()}),
        **sections)
