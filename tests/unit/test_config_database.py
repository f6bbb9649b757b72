"""``database.admission_coalesce`` and ``settlement_coalesce``: decoded, defaulted and
checked with its key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_settings
from gateway.errors import ConfigError

SHARED = "key_store: {type: postgres}\ngovernance_store: {type: postgres}\n"


def test_admission_coalesce_defaults_to_one(tmp_path: Path) -> None:
    """Without the key, shared mode coalesces with one admission call in flight."""
    path = tmp_path / "c.yaml"
    path.write_text(SHARED + "database: {}\n")
    assert load_settings(path).database.admission_coalesce == 1  # type: ignore[union-attr]


def test_admission_coalesce_is_read(tmp_path: Path) -> None:
    """A configured value reaches the settings unchanged."""
    path = tmp_path / "c.yaml"
    path.write_text(SHARED + "database: {admission_coalesce: 3}\n")
    assert load_settings(path).database.admission_coalesce == 3  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["-1", "1.5", "yes"])
def test_bad_admission_coalesce_names_the_key(tmp_path: Path, value: str) -> None:
    """A negative or non-integer value is refused, naming database.admission_coalesce."""
    path = tmp_path / "c.yaml"
    path.write_text(SHARED + f"database: {{admission_coalesce: {value}}}\n")
    with pytest.raises(ConfigError, match=r"database\.admission_coalesce"):
        load_settings(path)


def test_settlement_coalesce_defaults_to_one_and_is_read(tmp_path: Path) -> None:
    """database.settlement_coalesce defaults to 1 and takes the configured value."""
    path = tmp_path / "mayu.yaml"
    path.write_text(SHARED + "database: {}\n")
    assert load_settings(path).database.settlement_coalesce == 1  # type: ignore[union-attr]
    path.write_text(SHARED + "database: {settlement_coalesce: 0}\n")
    assert load_settings(path).database.settlement_coalesce == 0  # type: ignore[union-attr]
