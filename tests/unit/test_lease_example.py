"""The lease profile's example configs (``examples/lease/``, run by the README) load with
the programs' own config loaders, and inferplaned's binds every data-plane token to the
plane ids it may report for."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane.settings import load_config, may_report, resolve_tokens
from gateway.config import load_settings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lease"


def test_the_example_binds_each_data_plane_token_to_the_example_gateways_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No data-plane token in the example may report for any plane id (inferplaned warns
    about such a token at start), and the example gateway's id is one its token may
    report for: the README's two configs work together as written."""
    monkeypatch.setenv("INFERPLANED_WRITER_TOKEN", "w" * 32)
    monkeypatch.setenv("INFERPLANED_DATAPLANE_TOKEN", "d" * 32)
    monkeypatch.setenv("INFERPLANE_ADMIN_TOKEN", "a" * 32)
    config = load_config(EXAMPLES / "inferplaned.yaml")
    tokens = resolve_tokens(config.auth)
    assert tokens.dataplanes and tokens.unscoped == []
    gateway = load_settings(str(EXAMPLES / "mayu.yaml"))
    plane = gateway.server.replica_id
    assert plane is not None
    [bound] = [name for name, token in tokens.dataplanes.items() if token == "d" * 32]
    assert may_report(tokens.planes[bound], plane)
    raw = yaml.safe_load((EXAMPLES / "mayu.yaml").read_text())
    assert raw["control_plane"]["token_ref"] == "env:INFERPLANED_DATAPLANE_TOKEN"
