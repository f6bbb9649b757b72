"""Policy files and documents at their edges (issue 25): nesting, aliases, bytes that are
not text, and lease durations beyond any sensible bound.

``mayu policy validate`` runs in-process (an exception would fail the test where a
process would print a traceback); the hot reload is :class:`FilePolicySource`'s own.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.cli import main as mayu
from gateway.jsondepth import MAX_JSON_DEPTH
from gateway.policy import CompiledRule, FilePolicySource, compile_documents, validate_documents
from gateway.policy._wire import MAX_RENEW_MS

GOOD = """\
apiVersion: inferplane.dev/v1alpha1
kind: GovernancePolicy
metadata: {name: p}
spec:
  rules:
    - name: rate
      subject: {kind: team, team: platform}
      failurePolicy: FailOpen
      rate: {rpm: 10}
"""


def _deep_flow(depth: int) -> str:
    return GOOD.replace("{rpm: 10}", "[" * depth + "]" * depth)


def _deep_block(depth: int) -> str:
    nested = "".join("  " * (i + 4) + "a:\n" for i in range(depth)) + "  " * (depth + 4) + "1\n"
    return GOOD.replace(" {rpm: 10}\n", "\n" + nested)


def write(path: Path, text: str | bytes) -> None:
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    st_ = path.stat()  # a visible mtime change even on coarse-timestamp file systems
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))


def _validate(capsys: pytest.CaptureFixture[str], *files: Path) -> tuple[int, list[str]]:
    code = mayu(["policy", "validate", *map(str, files)])
    return code, capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("text", [_deep_flow(3000), _deep_block(1500)],
                         ids=["flow", "block"])
def test_validate_refuses_a_deeply_nested_file_naming_it_and_the_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    """A policy file nesting deeper than MAX_JSON_DEPTH (flow or block YAML, far past the
    parser's recursion limit) is one problem line naming the file and the limit, exit 1."""
    path = tmp_path / "deep.yaml"
    write(path, text)
    code, out = _validate(capsys, path)
    assert (code, out) == (1, [f"{path}: YAML nests arrays/objects more than "
                               f"{MAX_JSON_DEPTH} levels deep (the limit of this server)"])


def test_validate_refuses_aliases_and_bytes_that_are_not_utf8(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A YAML alias (which can make a document contain itself) and a file that is not
    UTF-8 are one problem line each; malformed YAML is one line with line and column."""
    alias = tmp_path / "alias.yaml"
    write(alias, "metadata: &m {name: p, labels: *m}\n")
    binary = tmp_path / "binary.yaml"
    write(binary, b"apiVersion: \xff\xfe\n")
    broken = tmp_path / "broken.yaml"
    write(broken, "a: b: c\n")
    code, out = _validate(capsys, alias, binary, broken)
    assert code == 1
    assert out == [f"{alias}: YAML: YAML aliases (*name) are not accepted: an alias can make "
                   "a document contain itself",
                   f"{binary}: not UTF-8 text (byte 12)",
                   f"{broken}: not valid YAML: line 1, column 5: mapping values are not "
                   "allowed here"]


async def test_a_nested_hot_reload_keeps_the_last_good_policy_and_logs_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A hot reload of a file nested past the limit keeps the previous generation and
    logs exactly one error line naming the file and the limit; fixing the file applies."""
    path = tmp_path / "p.yaml"
    write(path, GOOD)
    source = FilePolicySource([str(path)], poll_s=0)
    await source.start()
    before = source.snapshot()
    write(path, _deep_flow(5000))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gateway.policy"):
        assert source.reload() is False
    assert source.snapshot() is before
    [record] = caplog.records
    assert record.levelno == logging.ERROR and "\n" not in record.getMessage()
    assert record.getMessage() == (
        f"policy files rejected, keeping generation 1: invalid policy (1 problem): {path}: "
        f"YAML nests arrays/objects more than {MAX_JSON_DEPTH} levels deep (the limit of "
        "this server)")
    write(path, GOOD.replace("rpm: 10", "rpm: 11"))
    assert source.reload() is True and source.snapshot().rules[0].rpm == 11
    await source.stop()


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(
    st.binary(max_size=300),
    st.text(alphabet=st.sampled_from("[]{}:,-&*!| \n'\"ab1"), max_size=400),
    st.builds(lambda d, c: c * d, st.integers(100, 2000), st.sampled_from(["[", "{a: ", "- "]))))
def test_validate_never_raises_on_any_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str) -> None:
    """Whatever bytes a policy file holds, ``mayu policy validate`` exits 0 or 1 with
    lines, never an exception."""
    path = tmp_path / "fuzz.yaml"
    write(path, content)
    code, _ = _validate(capsys, path)
    assert code in (0, 1)


def _lease_doc(renew: str) -> dict[str, Any]:
    return yaml.safe_load(GOOD.replace(
        "rate: {rpm: 10}",
        "budget: {limitMilliUSD: 1000, window: day, lease: {grant: 10, renewInterval: "
        f"{renew}}}}}").replace("FailOpen", "FailClosed"))


@pytest.mark.parametrize("renew", ["99999999999999999999h", "25h", "24h1ms",
                                   "86400001ms", "1441m", "9999999999999999999999999999s"])
def test_a_renew_interval_above_24h_is_refused_naming_its_path(renew: str) -> None:
    """lease.renewInterval above MAX_RENEW_MS (24h) is a problem at its field path."""
    _, problems = validate_documents([_lease_doc(renew)])
    assert problems == [("p:spec.rules[0].budget.lease.renewInterval",
                         f"must be at most 24h; got {renew!r}")]


@pytest.mark.parametrize("renew,ms", [("24h", MAX_RENEW_MS), ("23h59m59s999ms", MAX_RENEW_MS - 1),
                                      ("1s", 1000)])
def test_renew_intervals_up_to_24h_compile(renew: str, ms: int) -> None:
    """24h itself, and anything from 1s to it, compiles to its milliseconds."""
    [rule] = compile_documents([_lease_doc(renew)])
    assert rule.lease_renew_ms == ms


def test_cli_validate_names_the_renew_interval_of_the_issue(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`mayu policy validate` refuses the issue's ``renewInterval: 99999999999999999999h``
    with exit 1 and the field path."""
    path = tmp_path / "lease.yaml"
    write(path, yaml.safe_dump(_lease_doc("99999999999999999999h")))
    code, out = _validate(capsys, path)
    assert (code, out) == (1, [f"{path}:p:spec.rules[0].budget.lease.renewInterval: must "
                               "be at most 24h; got '99999999999999999999h'"])


@pytest.mark.parametrize("subject,team,user", [("team", "a", None), ("team", "*", None),
                                               ("user", None, "ci"), ("user", None, "*"),
                                               ("team-user", "a", "ci"),
                                               ("team-user", "*", "*")])
def test_a_rule_fits_exactly_the_scopes_it_charges(subject: Any, team: str | None,
                                                   user: str | None) -> None:
    """fits_scope accepts every scope scope() gives a caller the rule applies to, and no
    other: a user rule's scope names the team (team=<t>,user=<u>), never user=<u> alone."""
    rule = CompiledRule(uid="p/r", policy="p", kind="budget", subject=subject, team=team,
                        user=user, limit_micro_usd=1, window="day")
    callers = [(t, u) for t in ("a", "b") for u in ("ci", "bob", None)]
    charged = {rule.scope(t, u) for t, u in callers if rule.applies_to(t, u)}
    assert charged and all(rule.fits_scope(s) for s in charged)
    others = {"user=ci", "user=*", "", "team=a,user=ci" if subject == "team" else "team=a"}
    if team == "a":
        others |= {"team=b", "team=b,user=ci"}
    if user == "ci":
        others |= {"team=a,user=bob"}
    assert not any(rule.fits_scope(s) for s in others), others
