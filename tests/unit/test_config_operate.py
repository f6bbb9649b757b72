"""The audit and alert settings: ranges, defaults and the webhook's required secret."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import load_settings, secret_refs
from gateway.errors import ConfigError

MOCK = {"providers": [{"name": "m", "kind": "mock"}],
        "models": [{"name": "x", "deployments": [{"provider": "m"}]}]}


def _write(tmp_path: Path, server: dict[str, object]) -> Path:
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump({**MOCK, "server": server}))
    return path


def _error(tmp_path: Path, server: dict[str, object]) -> str:
    path = _write(tmp_path, server)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    return info.value.message.removeprefix(f"{path}: ")


def test_defaults_bound_what_a_crash_loses() -> None:
    """By default: fsync every second, rotate at 64 MiB keeping 5, alerts on, no webhook."""
    server = load_settings(None).server
    assert (server.audit_fsync, server.audit_fsync_interval_s) == ("interval", 1.0)
    assert (server.audit_max_bytes, server.audit_keep) == (64 * 1024 * 1024, 5)
    assert server.alerts.enabled and server.alerts.webhook_url is None


@pytest.mark.parametrize(("server", "key"), [
    ({"audit_fsync": "sometimes"}, "server.audit_fsync"),
    ({"audit_fsync_interval_s": 0}, "server.audit_fsync_interval_s"),
    ({"audit_max_bytes": 0}, "server.audit_max_bytes"),
    ({"audit_keep": 0}, "server.audit_keep"),
    ({"audit_keep": 1001}, "server.audit_keep"),
    ({"alerts": {"retries": -1}}, "server.alerts.retries"),
    ({"alerts": {"timeout_s": float("nan")}}, "server.alerts.timeout_s"),
    ({"alerts": {"webhook": "x"}}, "server.alerts"),
])
def test_out_of_range_values_name_their_key(tmp_path: Path, server: dict[str, object],
                                            key: str) -> None:
    """A bad audit or alert value is refused at load, naming its key path."""
    assert key in _error(tmp_path, server)


def test_a_webhook_needs_an_http_url_and_a_secret(tmp_path: Path) -> None:
    """webhook_url must be http(s) and comes with secret_ref, which is a checked ref."""
    assert "server.alerts.webhook_url" in _error(
        tmp_path, {"alerts": {"webhook_url": "ftp://x", "secret_ref": "env:S"}})
    assert "server.alerts.secret_ref: required" in _error(
        tmp_path, {"alerts": {"webhook_url": "https://hooks.example/x"}})
    settings = load_settings(_write(tmp_path, {"alerts": {
        "webhook_url": "https://hooks.example/x", "secret_ref": "env:ALERT_SECRET"}}))
    assert ("server.alerts.secret_ref", "env:ALERT_SECRET") in secret_refs(settings)
