"""FilePolicySource (local profile) and ``mayu policy validate`` on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.cli import main as mayu
from gateway.policy import FilePolicySource, PolicyInvalid

GOOD = """\
apiVersion: inferplane.dev/v1alpha1
kind: GovernancePolicy
metadata: {{name: {name}}}
spec:
  rules:
    - name: rate
      subject: {{kind: team, team: platform}}
      failurePolicy: FailOpen
      rate: {{rpm: {rpm}}}
"""
BAD = """\
apiVersion: inferplane.dev/v1alpha1
kind: GovernancePolicy
metadata: {name: broken}
spec:
  rules:
    - name: spend
      subject: {kind: team, team: platform}
      failurePolicy: FailOpen
      budget: {limitMilliUSD: 0, window: year}
"""


def write(path: Path, text: str) -> None:
    path.write_text(text)
    # Force a visible mtime change even on coarse-timestamp file systems.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


async def test_start_loads_all_files_as_generation_one(tmp_path: Path) -> None:
    """start() compiles every matching file into generation 1 with a fingerprint."""
    write(tmp_path / "a.yaml", GOOD.format(name="a", rpm=10))
    write(tmp_path / "b.yaml", GOOD.format(name="b", rpm=20))
    source = FilePolicySource([str(tmp_path / "*.yaml")], poll_s=0)
    await source.start()
    snap = source.snapshot()
    assert (snap.namespace, snap.generation) == ("local", 1)
    assert [r.rpm for r in snap.rules] == [10, 20]
    assert len(snap.fingerprint) == 64
    await source.stop()


async def test_start_with_an_invalid_set_fails_listing_problems(tmp_path: Path) -> None:
    """Startup with an invalid document raises PolicyInvalid naming file and field."""
    write(tmp_path / "a.yaml", GOOD.format(name="a", rpm=10))
    write(tmp_path / "z.yaml", BAD)
    source = FilePolicySource([str(tmp_path / "*.yaml")], poll_s=0)
    with pytest.raises(PolicyInvalid) as info:
        await source.start()
    paths = {p for p, _ in info.value.problems}
    z = str(tmp_path / "z.yaml")
    assert paths == {f"{z}:broken:spec.rules[0].budget.limitMilliUSD",
                     f"{z}:broken:spec.rules[0].budget.window"}


async def test_missing_literal_file_fails_startup(tmp_path: Path) -> None:
    """A configured file that does not exist is a startup error, not an empty policy."""
    source = FilePolicySource([str(tmp_path / "nope.yaml")], poll_s=0)
    with pytest.raises(PolicyInvalid, match="no such file"):
        await source.start()


async def test_reload_applies_changes_and_bumps_generation(tmp_path: Path) -> None:
    """An edited file is applied as the next generation; an untouched set is not."""
    path = tmp_path / "a.yaml"
    write(path, GOOD.format(name="a", rpm=10))
    source = FilePolicySource([str(path)], poll_s=0)
    await source.start()
    assert source.reload() is False
    write(path, GOOD.format(name="a", rpm=99))
    assert source.reload() is True
    assert (source.snapshot().generation, source.snapshot().rules[0].rpm) == (2, 99)


async def test_invalid_edit_keeps_previous_snapshot(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """All or nothing: one invalid document keeps the whole previous generation."""
    write(tmp_path / "a.yaml", GOOD.format(name="a", rpm=10))
    source = FilePolicySource([str(tmp_path / "*.yaml")], poll_s=0)
    await source.start()
    before = source.snapshot()
    write(tmp_path / "a.yaml", GOOD.format(name="a", rpm=11))
    write(tmp_path / "z.yaml", BAD)
    assert source.reload() is False
    assert source.snapshot() is before
    assert "spec.rules[0].budget.window" in caplog.text


async def test_touch_without_change_keeps_generation(tmp_path: Path) -> None:
    """Rewriting identical content does not make a new generation (fingerprint equal)."""
    path = tmp_path / "a.yaml"
    write(path, GOOD.format(name="a", rpm=10))
    source = FilePolicySource([str(path)], poll_s=0)
    await source.start()
    write(path, GOOD.format(name="a", rpm=10))
    assert source.reload() is False
    assert source.snapshot().generation == 1


def test_cli_validate_prints_every_problem_and_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mayu policy validate` lists each problem with its path and exits 1."""
    write(tmp_path / "z.yaml", BAD)
    assert mayu(["policy", "validate", str(tmp_path / "z.yaml")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{tmp_path}/z.yaml:broken:spec.rules[0].budget.limitMilliUSD: must be > 0",
                   f"{tmp_path}/z.yaml:broken:spec.rules[0].budget.window: must be one of "
                   "day, month; got 'year'"]


def test_cli_validate_ok_prints_one_line_per_document(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mayu policy validate` exits 0 with one summary line per valid document."""
    write(tmp_path / "a.yaml", GOOD.format(name="a", rpm=10) + "---\n"
          + GOOD.format(name="b", rpm=5))
    assert mayu(["policy", "validate", str(tmp_path / "a.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("ok  ") and ": b: 1 rule (1 rate)" in out[1]


async def test_polling_hot_reloads_without_restart(tmp_path: Path) -> None:
    """The background poll picks up an edit by itself (generation 1 → 2)."""
    import asyncio

    path = tmp_path / "a.yaml"
    write(path, GOOD.format(name="a", rpm=10))
    source = FilePolicySource([str(path)], poll_s=0.02)
    await source.start()
    try:
        write(path, GOOD.format(name="a", rpm=7))
        for _ in range(1000):  # a bound against hanging, not a timing assertion
            if source.snapshot().generation == 2:
                break
            await asyncio.sleep(0.02)
        assert source.snapshot().rules[0].rpm == 7
    finally:
        await source.stop()
