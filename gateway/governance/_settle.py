"""What a settlement commits: the one place an observation becomes figures (DESIGN §5).

:func:`settlement_for` turns what the wire told the gateway (an :class:`Outcome`) into
the three figures and every counter's part:

- **committed** is what the upstream reported, priced exactly, never more: cache writes
  of unknown TTL at the cheaper class, a cut stream's observed classes only;
- **liability** is the unobserved remainder: for tokens-known, the difference to the
  dearer write class; for an uncertain outcome, the rest of the admitted bound. It binds
  hard limits like a reservation in the windows the permit was admitted in, and is
  never spend;
- requests count 1 unless nothing left the gateway (cancelled); an in-flight slot (a
  requests *window*, a concurrency rule's) commits 0 whatever the outcome, so every
  settlement frees it (an invalid one too: the stores release slots while freezing).

So for every permit committed ≤ truth ≤ committed + liability, with equality when the
wire reported the usage, and the settlement's per-class usage (what the audit line and
the request log show) adds up to its committed tokens. Valid usage above the bound is
committed in full and flagged ``bound_exceeded``; invalid usage commits nothing (the
store freezes the accounts).
"""

from __future__ import annotations

from gateway.governance._model import (
    AdmissionRequest,
    Outcome,
    OutcomeKind,
    Settlement,
    is_slot,
)
from gateway.pricing import ModelPrice, Usage, cost_range_micro_usd


def _observed(outcome: Outcome) -> Usage | None:
    """The usage an incomplete outcome proves: reported classes, and at least one output
    token per content delta already relayed (None: nothing at all was observed)."""
    if outcome.usage is None and outcome.output_floor <= 0:
        return None
    usage = outcome.usage or Usage()
    if outcome.output_floor > usage.output:
        usage = Usage(input=usage.input, output=outcome.output_floor,
                      cache_read=usage.cache_read, cache_write_5m=usage.cache_write_5m,
                      cache_write_1h=usage.cache_write_1h,
                      cache_write_unknown=usage.cache_write_unknown)
    return usage


def settlement_for(request: AdmissionRequest, outcome: Outcome,
                   price: ModelPrice | None = None) -> Settlement:
    """The settlement of ``request`` for ``outcome`` (``price``: the model's, needed
    whenever the outcome carries usage). Raises InvalidUsage for unpriceable usage."""
    kind = outcome.kind
    if kind is OutcomeKind.INVALID:
        return Settlement(kind=kind, detail=outcome.detail)
    if kind is OutcomeKind.CANCELLED:
        return split_settlement(request, Settlement(kind=kind, detail=outcome.detail))
    if kind is OutcomeKind.UNCERTAIN:
        # The classes recorded are the ones committed (the output floor included), so
        # the audit line and the request log add up to the committed tokens.
        observed = _observed(outcome)
        usage = observed or Usage()
        tokens, (low, _) = usage.total_tokens(), _range(usage, price)
        return split_settlement(request, Settlement(
            kind=kind, detail=outcome.detail, usage=observed,
            tokens_committed=tokens, usd_committed=low,
            tokens_liability=max(0, request.token_bound - tokens),
            usd_liability=max(0, request.usd_bound - low)))
    usage = outcome.usage or Usage()
    tokens, (low, high) = usage.total_tokens(), _range(usage, price)
    if not usage.price_certain:
        kind = OutcomeKind.TOKENS_KNOWN
    elif kind is OutcomeKind.TOKENS_KNOWN:
        kind = OutcomeKind.COMPLETE  # every write's TTL was reported after all
    return split_settlement(request, Settlement(
        kind=kind, detail=outcome.detail, usage=usage, tokens_committed=tokens,
        usd_committed=low, usd_liability=high - low,
        bound_exceeded=tokens > request.token_bound or low > request.usd_bound))


def _range(usage: Usage, price: ModelPrice | None) -> tuple[int, int]:
    if price is None:
        if usage.total_tokens():
            raise ValueError("settlement_for: usage given without the model's price")
        return 0, 0
    return cost_range_micro_usd(usage, price)


def split_settlement(request: AdmissionRequest, s: Settlement) -> Settlement:
    """Each charged counter's commit and liability, from the permit's totals.

    A TPM bucket is trued up to the actual token total (ADR-039; an uncertain outcome
    keeps its estimate and debits only what was observed beyond it); a token window or
    money window/account commits its committed part and keeps the rest as liability.
    """
    cancelled = s.kind is OutcomeKind.CANCELLED
    commits: dict[str, int] = {}
    liabilities: dict[str, int] = {}
    for c in request.charges:
        if c.dimension == "requests":
            commits[c.counter] = 0 if cancelled or is_slot(c) else 1
            continue
        committed, liability = ((s.tokens_committed, s.tokens_liability)
                                if c.dimension == "tokens"
                                else (s.usd_committed, s.usd_liability))
        if c.kind == "bucket":
            # TPM true-up (ADR-039): to the actual total when known; an uncertain
            # quantity never refunds the estimate, only debits what was observed beyond.
            commits[c.counter] = (max(c.amount, committed) if s.kind is OutcomeKind.UNCERTAIN
                                  else committed + liability)
            continue
        commits[c.counter] = committed
        if liability:
            liabilities[c.counter] = liability
    return Settlement(kind=s.kind, detail=s.detail, usage=s.usage,
                      tokens_committed=s.tokens_committed, usd_committed=s.usd_committed,
                      tokens_liability=s.tokens_liability, usd_liability=s.usd_liability,
                      bound_exceeded=s.bound_exceeded, commits=commits,
                      liabilities=liabilities, facts=s.facts)
