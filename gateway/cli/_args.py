"""Argument types of the ``mayu`` commands: bad input is one line and exit 2, never a
traceback.

Each type raises :class:`argparse.ArgumentTypeError`, which argparse reports as
``mayu <command>: error: argument --flag: <why>`` (one line, :mod:`gateway.cli`). Numbers
are checked against the ceiling the store or planner would apply (``gateway.ceilings``)
before any store is opened, as ASCII digits of bounded length, so no input reaches an
``int()`` or ``Decimal`` operation that could raise something else. A value is echoed
only as a short prefix: a megabyte of input is not printed back.
"""

from __future__ import annotations

import argparse
import re
from decimal import Decimal, DecimalException

from gateway.ceilings import MAX_AMOUNT

MICROS = 1_000_000
_DIGITS = re.compile(r"[0-9]{1,30}")
_DOLLARS = re.compile(r"[0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30}")
_SHOWN = 40
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def shown(text: str) -> str:
    """``text`` as an error message quotes it: repr'd, cut after a few characters."""
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def whole(text: str, *, low: int = 0, high: int = MAX_AMOUNT, unit: str = "") -> int:
    """A whole number in ``low..high`` written in ASCII digits (no sign, no exponent)."""
    digits = text.strip()
    if not _DIGITS.fullmatch(digits):
        if digits.startswith("-") and _DIGITS.fullmatch(digits[1:]):
            raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}{unit}")
        raise argparse.ArgumentTypeError(f"not a whole number: {shown(text)}")
    value = int(digits, 10)
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}{unit}")
    return value


def usd(text: str) -> int:
    """Dollars as an exact decimal string (``1.50``, ``$2``) to integer µUSD, at most
    ``MAX_AMOUNT`` µUSD and at most 6 decimal places."""
    amount = text.strip().removeprefix("$")
    if not _DOLLARS.fullmatch(amount):
        raise argparse.ArgumentTypeError(f"not a dollar amount: {shown(text)} "
                                         "(digits with at most one '.', e.g. 1.50)")
    try:
        micros = Decimal(amount) * MICROS
        integral = micros == micros.to_integral_value()
    except DecimalException:  # 30 + 30 digits stay far inside Decimal's context
        raise argparse.ArgumentTypeError(f"not a dollar amount: {shown(text)}") from None
    if not integral:
        raise argparse.ArgumentTypeError(f"{shown(text)}: more precise than one µUSD "
                                         "(at most 6 decimal places)")
    if micros > MAX_AMOUNT:
        raise argparse.ArgumentTypeError(f"must be at most ${MAX_AMOUNT // MICROS} "
                                         f"({MAX_AMOUNT} µUSD)")
    return int(micros)


def text(value: str) -> str:
    """A name, id or label: text a store can keep (argv bytes that are not UTF-8 reach
    Python as lone surrogates, which no store can encode)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("not valid UTF-8 text") from None
    return value


def label(value: str) -> str:
    """An id that names files (a replica id): letters, digits, ``.``, ``_``, ``-``, at
    most 63 characters, not starting with a dot or dash."""
    if not _LABEL.fullmatch(value):
        raise argparse.ArgumentTypeError(f"not an id: {shown(value)} (letters, digits, "
                                         "'.', '_', '-'; at most 63)")
    return value
