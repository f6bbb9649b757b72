"""Test helpers: settlements at explicit figures, for store tests that need no prices.

Production code computes every settlement with :func:`gateway.governance.settlement_for`
(usage priced by the model). Store tests often want "commit 10 tokens and 1,234 µUSD"
without a price table: :func:`exact` says that, and :func:`settlement` turns it (or a
plain Outcome) into the Settlement the store executes, split per counter the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.governance import (
    AdmissionRequest,
    Outcome,
    OutcomeKind,
    Settlement,
    settlement_for,
    split_settlement,
)
from gateway.pricing import ModelPrice

TEST_PRICE = ModelPrice(input=1_000_000, output=5_000_000, cache_read=100_000,
                        cache_write_5m=1_250_000, cache_write_1h=2_000_000)
"""What :func:`settlement` prices usage with: $1/$5 per Mtok, Anthropic's cache ratios."""


@dataclass(frozen=True)
class Exact:
    tokens: int
    usd: int
    kind: OutcomeKind = OutcomeKind.COMPLETE
    detail: str = ""


def exact(tokens: int, usd: int, *, detail: str = "") -> Exact:
    """A complete outcome committing exactly ``tokens`` and ``usd`` µUSD."""
    return Exact(tokens=tokens, usd=usd, detail=detail)


def settlement(request: AdmissionRequest, what: Outcome | Exact) -> Settlement:
    if isinstance(what, Exact):
        return split_settlement(request, Settlement(
            kind=what.kind, detail=what.detail, tokens_committed=what.tokens,
            usd_committed=what.usd))
    return settlement_for(request, what, TEST_PRICE)
