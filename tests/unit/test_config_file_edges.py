"""A config file that is not one (binary, absurdly nested) is one ConfigError line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_settings
from gateway.errors import ConfigError


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"a:\n" + b"[" * 100_000])
def test_a_config_file_that_is_not_one_names_the_file(tmp_path: Path, content: bytes) -> None:
    """Non-UTF-8 or deeply nested bytes give a ConfigError naming the file, no traceback."""
    path = tmp_path / "mayu.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="mayu.yaml"):
        load_settings(path)
