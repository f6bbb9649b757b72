"""Every ``mayu`` option that takes a number or a name answers any text with a value a
store accepts, or with one line and exit 2 — never a traceback (issue 25).

Hypothesis over arbitrary strings (and number-like ones: huge, negative, exponents,
non-ASCII digits, lone surrogates as undecodable argv bytes arrive) through the real
parser (:func:`gateway.cli.build_parser`); nothing is opened. ``mayu permits`` has its
own tests (tests/integration/test_hardening_permits_cli.py).
"""

from __future__ import annotations

import argparse
import io
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.ceilings import MAX_AMOUNT, MAX_BUCKET_CAPACITY
from gateway.cli import build_parser

# (command line before the option, option, what an accepted value must be)
AMOUNT = ("int", 0, MAX_AMOUNT)
RATE = ("int", 1, MAX_BUCKET_CAPACITY)
COUNT = ("int", 1, 2**31 - 1)
NAME = ("str", 0, 0)
TEAM_CREATE = ["teams", "create", "t"]
KEY_CREATE = ["keys", "create", "--team", "t"]
OPTIONS: list[tuple[list[str], str, tuple[str, int, int]]] = [
    *[(TEAM_CREATE, flag, kind) for flag, kind in (
        ("--rpm", RATE), ("--tpm", RATE), ("--tokens-per-day", AMOUNT),
        ("--usd-per-day", AMOUNT), ("--usd-micros-per-day", AMOUNT),
        ("--usd-per-month", AMOUNT), ("--usd-micros-per-month", AMOUNT),
        ("--budget-fit-floor", AMOUNT))],
    (["teams", "set", "t"], "--expected-revision", COUNT),
    (["teams", "set", "t"], "--unset", ("list", 0, 0)),
    *[(KEY_CREATE, flag, kind) for flag, kind in (
        ("--rpm", RATE), ("--usd-per-day", AMOUNT), ("--usd-micros-per-month", AMOUNT),
        ("--expires-in-days", ("int", 1, 36_500)), ("--user", NAME), ("--name", NAME),
        ("--models", NAME))],
    (["keys", "list"], "--team", NAME),
    (["keys", "revoke", "key_1"], "--expected-revision", COUNT),
    (["serve"], "--port", ("int", 0, 65535)),
    (["serve"], "--workers", ("int", 1, 64)),
    (["mock-upstream"], "--port", ("int", 0, 65535)),
    (["mock-upstream"], "--latency-ms", ("int", 0, 600_000)),
]
_DEST = {"--usd-per-day": "usd_per_day", "--usd-per-month": "usd_per_month"}

number_like = st.one_of(
    st.integers().map(str),
    st.integers(min_value=0).map(lambda n: str(n) + "0" * 40),
    st.decimals(allow_nan=True, allow_infinity=True).map(str),
    st.floats().map(repr),
    st.sampled_from(["1e999999999", "-0", "+5", "1_000", " 7 ", "٣", "１２", "0x10", "$",
                     "$1.50", "1.0000001", ".5", "5.", "nan", "-inf", "9" * 5000, "\udcff",
                     "a\udcffb", "", "\x00", "1\n2"]),
)


_PARSER = build_parser()  # argparse parsers are reusable: built once, not per example


def _parse(argv: list[str]) -> tuple[int, str, argparse.Namespace | None]:
    """(exit code, stderr, parsed namespace or None) of parsing ``argv``."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            args = _PARSER.parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0), err.getvalue(), None
    return 0, err.getvalue(), args


@pytest.mark.parametrize("head,flag,kind", OPTIONS, ids=[f"{' '.join(h[:2])} {f}"
                                                         for h, f, _ in OPTIONS])
@settings(max_examples=60)
@given(value=st.one_of(st.text(), number_like))
@example(value="99999999999999999999999")
@example(value="a\udcffb")  # argv bytes that are not UTF-8
@example(value="1e999999999")
def test_any_text_is_a_bounded_value_or_one_line_and_exit_2(
        head: list[str], flag: str, kind: tuple[str, int, int], value: str) -> None:
    """An option's value is accepted within what the store accepts, or refused with
    exit 2 and exactly one stderr line naming the option; nothing else escapes."""
    code, err, args = _parse([*head, f"{flag}={value}"])
    if args is None:
        assert code == 2
        [line] = err.splitlines()
        assert line.startswith(f"mayu {' '.join(head[:2])}: error: argument {flag}: "), line
        assert len(line) < 400, line  # the value is never echoed in full
        return
    got = getattr(args, _DEST.get(flag, flag.lstrip("-").replace("-", "_")))
    shape, low, high = kind
    if shape == "int":
        assert isinstance(got, int) and low <= got <= high
    elif shape == "str":
        assert got == value
        got.encode("utf-8")  # a store can keep it


def test_usage_errors_are_one_line_naming_the_help() -> None:
    """A missing sub-command or an unknown one is one line pointing at --help, exit 2."""
    for argv, prog in ((["teams"], "mayu teams"), (["nope"], "mayu"),
                       (["keys", "create"], "mayu keys create")):
        code, err, _ = _parse(argv)
        [line] = err.splitlines()
        assert code == 2 and line.startswith(f"{prog}: error: ") and line.endswith(
            f"(see {prog} --help)"), line
