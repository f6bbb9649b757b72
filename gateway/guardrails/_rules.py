"""Tenant regexes: compiled with RE2 (``google-re2`` from PyPI), a linear-time engine.

RE2 never backtracks, so no pattern can stall the gateway: matching is linear in the
text. It refuses backreferences and lookarounds at compile time. On top of that a
pattern is refused when it is longer than 512 characters or its compiled program is
larger than :data:`MAX_PROGRAM` (a ``{1000}`` repetition blows it up), so matching stays
cheap as well as linear.
"""

from __future__ import annotations

from typing import Any

import re2  # type: ignore[import-untyped]

MAX_PROGRAM = 2000
"""RE2 program size limit (instructions) for a tenant pattern."""


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported once, by its key
    options.max_mem = 8 << 20
    return options


def vet(pattern: str) -> Any:
    """``pattern`` compiled by RE2, or ValueError saying why it is refused."""
    if len(pattern) > 512:
        raise ValueError("a guardrail pattern is at most 512 characters")
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as exc:
        why = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(f"not a linear-time (RE2) pattern: {why}") from None
    if compiled.programsize > MAX_PROGRAM:
        raise ValueError(f"pattern too large (RE2 program of {compiled.programsize} "
                         f"instructions; at most {MAX_PROGRAM})")
    if compiled.search("") is not None:
        raise ValueError("a guardrail pattern must not match the empty string")
    return compiled
