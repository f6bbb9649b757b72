"""inferplaned config loading and token authentication (no database needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.auth import NotAuthenticated, ReadOnlyToken, TokenAuth
from controlplane.cli import check_bind
from controlplane.settings import (
    AuthSettings,
    ControlPlaneConfig,
    ListenSettings,
    load_config,
    resolve_tokens,
)
from gateway.errors import ConfigError

W, R = "writer-token-0123456789", "reader-token-0123456789"


def test_writer_reader_and_unknown_tokens() -> None:
    """Writers may write, readers may only read, anything else is unauthenticated."""
    auth = TokenAuth({"ci": W}, {"dash": R})
    assert auth.require(f"Bearer {W}", write=True).name == "ci"
    assert auth.require(f"bearer {R}", write=False).name == "dash"
    with pytest.raises(ReadOnlyToken):
        auth.require(f"Bearer {R}", write=True)
    for header in (None, "", "Bearer", f"Basic {W}", f"Bearer {W}x", W):
        with pytest.raises(NotAuthenticated):
            auth.identify(header)


def test_no_tokens_means_unauthenticated_writer() -> None:
    """With no token configured every caller is the writer 'unauthenticated'."""
    identity = TokenAuth({}, {}).require(None, write=True)
    assert (identity.name, identity.role) == ("unauthenticated", "writer")


def test_unauthenticated_bind_is_loopback_only() -> None:
    """No token: loopback binds are allowed (False = unauthenticated), others refused."""
    config = ControlPlaneConfig()
    assert check_bind(config, "127.0.0.1") is False
    assert check_bind(config, "::1") is False
    with pytest.raises(ConfigError, match="listen.host"):
        check_bind(config, "0.0.0.0")


def test_token_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens: references only, >= 16 chars, one identity per token, unique names."""
    monkeypatch.setenv("T1", W)
    monkeypatch.setenv("SHORT", "short")
    with pytest.raises(ConfigError, match="auth.writer_tokens_ref.a: token must be"):
        resolve_tokens(AuthSettings(writer_tokens_ref={"a": "env:SHORT"}))
    with pytest.raises(ConfigError, match="references"):
        resolve_tokens(AuthSettings(writer_tokens_ref={"a": W}))
    with pytest.raises(ConfigError, match="same token"):
        resolve_tokens(AuthSettings(writer_tokens_ref={"a": "env:T1"},
                                    reader_tokens_ref={"b": "env:T1"}))
    monkeypatch.setenv("T2", R)
    with pytest.raises(ConfigError, match="name also used"):
        resolve_tokens(AuthSettings(writer_tokens_ref={"a": "env:T1"},
                                    reader_tokens_ref={"a": "env:T2"}))
    assert check_bind(ControlPlaneConfig(
        listen=ListenSettings(host="0.0.0.0"),
        auth=AuthSettings(writer_tokens_ref={"a": "env:T1"})), "0.0.0.0") is True


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    """An unknown or mistyped config key fails naming its path."""
    path = tmp_path / "c.yaml"
    path.write_text("listen: {host: 127.0.0.1, prot: 1}\n")
    with pytest.raises(ConfigError, match="listen"):
        load_config(path)
    path.write_text("listen: {port: 70000}\n")
    with pytest.raises(ConfigError, match="listen.port"):
        load_config(path)
