"""Form fields to API bodies: integers read strictly, a message per bad field.

A bad value never reaches the API (and never a 500): it comes back as a message next to
its field. Every number a console form or query carries is read by :func:`whole_number`
(ASCII digits only, at most :data:`MOST`, so neither ``²`` nor 4,300 digits reaches
``int``). The API's own 400s name their field too (``param``), and :func:`field_of`
places them the same way.
"""

from __future__ import annotations

from typing import Any

from gateway.ceilings import MAX_AMOUNT

MOST = MAX_AMOUNT
"""The largest number any console field takes (the money ceiling, the largest of all);
the API refuses what its own field does not take, by that field."""

TEAM_LIMITS = ("usd_micros_per_day", "usd_micros_per_month", "tokens_per_day", "rpm",
               "tpm", "budget_fit_floor")
MEMBER_LIMITS = ("tokens_per_day", "usd_micros_per_day", "usd_micros_per_month")
KEY_LIMITS = ("usd_micros_per_day", "usd_micros_per_month", "rpm", "tpm")
LABELS = {"usd_micros_per_day": "Money per UTC day (µUSD)",
          "usd_micros_per_month": "Money per UTC month (µUSD)",
          "tokens_per_day": "Tokens per UTC day (tokens)",
          "rpm": "Requests per minute (requests)", "tpm": "Tokens per minute (tokens)",
          "budget_fit_floor": "Budget fit floor (tokens)"}


class NotAWholeNumber(ValueError):
    """A field that is not a whole number in 0..MOST (its message says which way)."""


def whole_number(raw: str) -> int:
    """``raw`` as a whole number in 0..:data:`MOST` (``1,000`` and ``1_000`` read as
    1000); :class:`NotAWholeNumber` with the field's message otherwise."""
    digits = raw.strip().replace(",", "").replace("_", "")
    if not (digits.isascii() and digits.isdigit()):
        raise NotAWholeNumber("a whole number (0 or more)")
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(MOST)) or int(significant) > MOST:
        raise NotAWholeNumber(f"at most {MOST:,}")
    return int(significant)


def limits(form: Any, names: tuple[str, ...],
           errors: dict[str, str]) -> dict[str, int | None]:
    """The limits of ``names`` in ``form``: blank is no cap; else a whole number."""
    out: dict[str, int | None] = {}
    for name in names:
        raw = str(form.get(name) or "").strip()
        if not raw:
            out[name] = None
            continue
        try:
            out[name] = whole_number(raw)
        except NotAWholeNumber as exc:
            errors[name] = f"{exc}, or blank for no cap"
    return out


def field_of(param: Any, fields: tuple[str, ...]) -> str:
    """Which form field an API error's ``param`` names (``$.limits.rpm`` → ``rpm``);
    ``_form`` when none does."""
    text = str(param or "")
    for name in sorted(fields, key=len, reverse=True):
        if text == name or text.endswith(f".{name}") or text.endswith(f"`{name}`"):
            return name
    return "_form"


def text(form: Any, name: str) -> str:
    return str(form.get(name) or "").strip()
