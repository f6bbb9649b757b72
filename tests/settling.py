"""Test helpers: settlements at explicit figures, for store tests that need no prices.

Production code computes every settlement with :func:`gateway.governance.settlement_for`
(usage priced by the model). Store tests often want "commit 10 tokens and 1,234 µUSD"
without a price table: :func:`exact` says that, and :func:`settlement` turns it (or a
plain Outcome) into the Settlement the store executes, split per counter the same way;
:func:`spend` admits one request and settles it so.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from gateway.governance import (
    AdmissionRequest,
    GovernanceStore,
    Outcome,
    OutcomeKind,
    Permit,
    Settlement,
    build_request,
    settlement_for,
    split_settlement,
)
from gateway.keys import Principal
from gateway.policy import EMPTY_SNAPSHOT
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


async def spend(store: GovernanceStore, who: Principal, usd: int, what: Outcome | Exact | None,
                *, now: datetime, tokens: int = 100,
                request_id: str | None = None) -> tuple[Permit, Settlement | None]:
    """One request of ``who`` (model ``m``, bounded at ``tokens`` and ``usd`` µUSD),
    admitted alone and settled at ``what`` (``None``: left pending); its permit and
    settlement. A refusal fails the test."""
    req = build_request(who, EMPTY_SNAPSHOT, request_id=request_id or uuid.uuid4().hex,
                        model="m", token_bound=tokens, usd_bound=usd, now=now)
    [permit] = await store.admit([req])
    assert isinstance(permit, Permit), permit
    if what is None:
        return permit, None
    done = settlement(req, what)
    await store.settle(permit.id, done)
    return permit, done
