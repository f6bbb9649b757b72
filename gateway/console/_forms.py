"""Form fields to API bodies: integers read strictly, a message per bad field.

A bad value never reaches the API (and never a 500): it comes back as a message next to
its field. The API's own 400s name their field too (``param``), and :func:`field_of`
places them the same way.
"""

from __future__ import annotations

from typing import Any

TEAM_LIMITS = ("usd_micros_per_day", "usd_micros_per_month", "tokens_per_day", "rpm",
               "tpm", "budget_fit_floor")
MEMBER_LIMITS = ("tokens_per_day", "usd_micros_per_day", "usd_micros_per_month")
KEY_LIMITS = ("usd_micros_per_day", "usd_micros_per_month", "rpm", "tpm")
LABELS = {"usd_micros_per_day": "Money per UTC day (µUSD)",
          "usd_micros_per_month": "Money per UTC month (µUSD)",
          "tokens_per_day": "Tokens per UTC day (tokens)",
          "rpm": "Requests per minute (requests)", "tpm": "Tokens per minute (tokens)",
          "budget_fit_floor": "Budget fit floor (tokens)"}


def limits(form: Any, names: tuple[str, ...],
           errors: dict[str, str]) -> dict[str, int | None]:
    """The limits of ``names`` in ``form``: blank is no cap; else a whole number."""
    out: dict[str, int | None] = {}
    for name in names:
        raw = str(form.get(name) or "").strip().replace(",", "").replace("_", "")
        if not raw:
            out[name] = None
        elif raw.isdigit() and raw.isascii():
            out[name] = int(raw)
        else:
            errors[name] = "a whole number (0 or more), or blank for no cap"
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
