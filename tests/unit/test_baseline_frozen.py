"""The schema's structure as files: the 0.1.0 baseline is frozen, byte for byte.

The pins are written here, not read from :data:`sql.BASELINE_SHA256`: editing a frozen
file, or editing it and the pins in ``sql/`` together, fails this test (CONTRIBUTING.md).
"""

from __future__ import annotations

import hashlib
from importlib import resources

import pytest

import sql

RELEASED_0_1_0 = {
    "schema": "a58b9f6ea42434ad6e44ec4b82932a8b7efb6d3ca8becc2ad339acb270f29ed5",
    "key_rotations": "d534957dd6f998de6b6b463cc10af3ddfb50abbf0a39962b69cac95d8528ce48",
    "members": "de4076260a628b2fd4853f57d219b9482dfaed315a6461dd990b38e47fffc2ea",
    "request_log": "0ef055c272667a021f6a1ae31ee6d00972d9db96a02900ff0fad3f0b635d6769",
    "governance": "4b19adb2ef14f7f878ac6316b21ea335d8507e873877fe1a8987c342ea211761",
    "lease": "f558d8842c0564b978af6e24c1849423cafdd76ae8e44fbe244ab41f454b03cc",
}


def _frozen() -> dict[str, bytes]:
    folder = resources.files("migrations").joinpath("baseline")
    return {f.name.removesuffix(".sql"): f.read_bytes()
            for f in folder.iterdir() if f.name.endswith(".sql")}


def test_the_frozen_baseline_is_the_released_text() -> None:
    """migrations/baseline/*.sql are exactly the six files 0.1.0 released."""
    found = {name: hashlib.sha256(text).hexdigest() for name, text in _frozen().items()}
    assert found == RELEASED_0_1_0


def test_the_baseline_installs_the_frozen_files_in_order() -> None:
    """The baseline revision installs the six frozen files, in the released order, under
    the released pins."""
    assert tuple(RELEASED_0_1_0) == sql.BASELINE
    assert sql.BASELINE_SHA256 == RELEASED_0_1_0
    for name in sql.BASELINE:
        assert sql.baseline_script(name).encode() == _frozen()[name]


def test_an_edited_baseline_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline revision refuses a frozen file whose text is not the released one."""
    monkeypatch.setitem(sql.BASELINE_SHA256, "lease", "0" * 64)
    with pytest.raises(RuntimeError, match="migrations/baseline/lease.sql is not the text"):
        sql.baseline_script("lease")
