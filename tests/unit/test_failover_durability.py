"""The startup durability check's judgement (``gateway.db.durability_problems``): which
database settings lose acknowledged commits in a failover, and which do not."""

from __future__ import annotations

import pytest

from gateway.db import durability_problems


@pytest.mark.parametrize("commit", ["on", "remote_write", "remote_apply"])
def test_synchronous_replication_has_no_problem(commit: str) -> None:
    """A primary waiting for a named synchronous standby (on, remote_write or
    remote_apply) is durable across a failover: nothing to warn about."""
    assert durability_problems(synchronous_commit=commit,
                               synchronous_standby_names='"pg1"', in_recovery=False,
                               standbys=2) == []


def test_a_lone_server_has_no_failover_problem() -> None:
    """No streaming standby visible (one server, or a storage-level HA): no warning."""
    assert durability_problems(synchronous_commit="on", synchronous_standby_names="",
                               in_recovery=False, standbys=0) == []


@pytest.mark.parametrize(("commit", "names"), [("on", ""), ("local", "pg1"),
                                               ("remote_write", " ")])
def test_asynchronous_standbys_are_named_loudly(commit: str, names: str) -> None:
    """Standbys streaming but no commit waiting for one: one problem naming both
    settings, what it costs (the same budget spent twice), and the fix."""
    [problem] = durability_problems(synchronous_commit=commit,
                                    synchronous_standby_names=names, in_recovery=False,
                                    standbys=1)
    assert f"synchronous_commit={commit}" in problem
    assert "synchronous_standby_names=" in problem
    assert "spend the same budget twice" in problem
    assert "synchronous_mode: true" in problem


def test_synchronous_commit_off_and_a_standby_are_each_named() -> None:
    """synchronous_commit=off loses commits even without a failover; a DSN reaching a
    standby admits nothing: both said, the second naming target_session_attrs."""
    problems = durability_problems(synchronous_commit="off",
                                   synchronous_standby_names="pg1", in_recovery=True,
                                   standbys=0)
    assert len(problems) == 2
    assert "target_session_attrs=read-write" in problems[0]
    assert "synchronous_commit=off" in problems[1]
