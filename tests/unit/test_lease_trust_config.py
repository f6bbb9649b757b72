"""Data-plane tokens bound to plane ids, and the windows a report may name (issue 25)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.leases import open_periods
from controlplane.settings import load_config, may_report, resolve_tokens
from gateway.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inferplaned.yaml"
    path.write_text(text)
    return path


def test_a_token_binds_ids_and_prefixes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    """``planes`` lists exact ids and ``prefix*`` entries; a bare reference binds none."""
    monkeypatch.setenv("TA", "a" * 20)
    monkeypatch.setenv("TB", "b" * 20)
    config = load_config(write(tmp_path, """
auth:
  dataplane_tokens_ref:
    node-a: {token_ref: "env:TA", planes: [node-a, pool-a-*]}
    legacy: env:TB
"""))
    tokens = resolve_tokens(config.auth)
    assert tokens.planes == {"node-a": ("node-a", "pool-a-*")}
    assert tokens.unscoped == ["legacy"]
    bound = tokens.planes["node-a"]
    assert may_report(bound, "node-a") and may_report(bound, "pool-a-17")
    assert not may_report(bound, "node-ab") and not may_report(bound, "pool-b-1")
    assert may_report(None, "anything")


@pytest.mark.parametrize(("planes", "error"), [
    ("[]", "planes"),
    ('["*"]', "planes"),
    ('["node a"]', "planes"),
])
def test_a_bad_plane_list_is_refused_with_its_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planes: str, error: str) -> None:
    """An empty list, a bare ``*`` (that is the unbound form) or a blank in an id fail
    at load, naming the key."""
    monkeypatch.setenv("TA", "a" * 20)
    path = write(tmp_path, f"""
auth:
  dataplane_tokens_ref:
    node-a: {{token_ref: "env:TA", planes: {planes}}}
""")
    with pytest.raises(ConfigError, match=error):
        load_config(path)


def test_one_plane_id_bound_to_two_tokens_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plane id belongs to one token: listing it under two is a config error."""
    monkeypatch.setenv("TA", "a" * 20)
    monkeypatch.setenv("TB", "b" * 20)
    config = load_config(write(tmp_path, """
auth:
  dataplane_tokens_ref:
    one: {token_ref: "env:TA", planes: [node-a]}
    two: {token_ref: "env:TB", planes: [node-b, node-a]}
"""))
    with pytest.raises(ConfigError, match="'node-a' is also bound to token 'one'"):
        resolve_tokens(config.auth)


@pytest.mark.parametrize(("now", "days", "months"), [
    (datetime(2026, 12, 4, 12, 0, tzinfo=UTC), {"2026-12-04"}, {"2026-12"}),
    (datetime(2026, 12, 4, 0, 10, tzinfo=UTC), {"2026-12-03", "2026-12-04"}, {"2026-12"}),
    (datetime(2026, 12, 31, 23, 50, tzinfo=UTC), {"2026-12-31", "2027-01-01"},
     {"2026-12", "2027-01"}),
    (datetime(2027, 1, 1, 0, 5, tzinfo=UTC), {"2026-12-31", "2027-01-01"},
     {"2026-12", "2027-01"}),
])
def test_open_periods_are_the_current_window_and_its_neighbour_near_midnight(
        now: datetime, days: set[str], months: set[str]) -> None:
    """Today and this month; yesterday (last month) within the grace after midnight,
    tomorrow (next month) within the grace before it; never a far or impossible one."""
    periods = open_periods(now, grace_s=1800)
    assert periods["day"] == days and periods["month"] == months
