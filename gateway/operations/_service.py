"""Resolving a permit and lifting a freeze, as an operator, through the store's own
paths: a resolution is a settlement (exactly once, a replay harmless, a different
outcome refused with the stored one named); an exact figure is checked against the
store's ceilings before anything is written."""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from gateway.ceilings import MAX_AMOUNT, MAX_TOKENS_PER_CLASS
from gateway.config import ModelSettings
from gateway.errors import BadRequest, NotFound, SettlementConflict, UnknownPermit
from gateway.governance import (
    FrozenCounter,
    Outcome,
    OutcomeKind,
    Permit,
    PermitInfo,
    Settlement,
    SettleResult,
    check_settlement,
    settlement_for,
    split_settlement,
)
from gateway.pricing import InvalidUsage, ModelPrice, Usage


class OperatorStore(Protocol):
    """What an operator's action needs of a governance store (both stores have it)."""

    async def get_permit(self, permit_id: str) -> Permit | None: ...

    async def permit_info(self, permit_id: str) -> PermitInfo | None: ...

    async def settle(self, permit_id: str, settlement: Settlement) -> SettleResult: ...

    async def resolve(self, permit_id: str, settlement: Settlement) -> SettleResult: ...

    async def frozen(self) -> list[FrozenCounter]: ...

    async def unfreeze(self, name: str) -> bool: ...

    async def counter(self, name: str) -> object | None: ...


async def permit_of(store: OperatorStore, permit_id: str) -> Permit:
    permit = await store.get_permit(permit_id)
    if permit is None:
        raise UnknownPermit(f"permit {permit_id!r}: no such permit in this governance "
                            "store (see mayu permits list)")
    return permit


async def settle_as_operator(store: OperatorStore, permit_id: str, settlement: Settlement,
                             *, exact: bool) -> SettleResult:
    """Settle (or, with an exact figure, resolve) one permit through the store's own
    path: exactly once, replays harmless, a different outcome refused."""
    try:
        return await (_resolve(store, permit_id, settlement) if exact
                      else store.settle(permit_id, settlement))
    except SettlementConflict:
        stored = await store.permit_info(permit_id)
        raise SettlementConflict(
            f"permit {permit_id} was already settled as {_stored(stored)}; resolving it "
            f"as {settlement.kind} is refused (a permit is settled exactly once; only an "
            "uncertain or tokens-known one takes a later exact figure)") from None


async def _resolve(store: OperatorStore, permit_id: str,
                   settlement: Settlement) -> SettleResult:
    """An exact figure, exactly once. The store's settle path answers a permit already
    settled with this very settlement (the same fingerprint: kind, totals, every
    counter's part) as a replay, and settles a pending one; only a permit settled another
    way goes on to the store's resolve, which replaces an uncertain or tokens-known
    permit's liability. Asked once more after a conflict there, so that the same figure
    sent twice at once is one resolution and one replay, not a 409."""
    try:
        return await store.settle(permit_id, settlement)
    except SettlementConflict:
        pass
    try:
        return await store.resolve(permit_id, settlement)
    except SettlementConflict:
        return await store.settle(permit_id, settlement)


async def resolve_permit(store: OperatorStore, permit_id: str, kind: OutcomeKind,
                         reason: str) -> SettleResult:
    """Settle one pending permit as uncertain (its bounds become liability) or cancelled
    (refunded), exactly once; the settlement's detail is ``operator: <reason>``."""
    permit = await permit_of(store, permit_id)
    outcome = Outcome(kind=kind, detail=f"operator: {reason}")
    return await settle_as_operator(store, permit_id,
                                    settlement_for(permit.request, outcome), exact=False)


def price_of(models: list[ModelSettings], model: str) -> ModelPrice | None:
    for m in models:
        if m.name == model:
            return m.price
    return None


USAGE_KEYS = tuple(f.name for f in msgspec.structs.fields(Usage))


def usage_of(given: dict[str, Any], *, label: str) -> Usage:
    """The exact usage an operator gives (``--usage`` JSON, the API's ``usage``), or a
    :class:`BadRequest` naming ``label``: at least one token class (an empty usage is
    not a $0 settlement), no unknown key (a typo would count as 0 tokens), each an
    integer in 0..``MAX_TOKENS_PER_CLASS``."""
    allowed = ", ".join(USAGE_KEYS)
    param = label.lstrip("-")
    if not given:
        raise BadRequest(f"{label}: give at least one of {allowed} (an empty usage is "
                         "not a settlement)", param=param)
    for key, value in given.items():
        if key not in USAGE_KEYS:
            raise BadRequest(f"{label}: unknown key {key!r} (allowed: {allowed})",
                             param=param)
        if (not isinstance(value, int) or isinstance(value, bool)
                or not 0 <= value <= MAX_TOKENS_PER_CLASS):
            raise BadRequest(f"{label}: {key} must be an integer in "
                             f"0..{MAX_TOKENS_PER_CLASS} (tokens), got {value!r}",
                             param=param)
    try:
        return msgspec.convert(given, Usage).validate()
    except (msgspec.ValidationError, InvalidUsage) as exc:  # the checks above cover it
        raise BadRequest(f"{label}: {exc} (allowed: {allowed})", param=param) from None


def settlement_at_usage(permit: Permit, usage: Usage, price: ModelPrice, *, reason: str,
                        label: str = "--usage") -> Settlement:
    """The settlement at an exact usage, priced with the model's price."""
    try:
        settlement = settlement_for(
            permit.request, Outcome(kind=OutcomeKind.COMPLETE, usage=usage,
                                    detail=f"operator: {reason}"), price)
        check_settlement(permit.request, settlement)
    except InvalidUsage as exc:
        raise BadRequest(f"{label}: at the model's price this is not a settlement the "
                         f"store can take ({exc}); figures must stay within "
                         f"0..{MAX_AMOUNT}", param=label.lstrip("-")) from None
    return settlement


def settlement_at_cost(permit: Permit, *, usd: int, tokens: int | None, reason: str,
                       label: str = "--cost-micro-usd") -> Settlement:
    """The settlement at an exact µUSD figure; without ``tokens`` the token count stays
    liability (the bound)."""
    req = permit.request
    base = Settlement(kind=OutcomeKind.COMPLETE if tokens is not None else OutcomeKind.UNCERTAIN,
                      detail=f"operator: {reason}", usd_committed=usd,
                      tokens_committed=tokens or 0,
                      tokens_liability=0 if tokens is not None else req.token_bound,
                      bound_exceeded=usd > req.usd_bound or (tokens or 0) > req.token_bound)
    settlement = split_settlement(req, base)
    try:
        check_settlement(req, settlement)
    except InvalidUsage as exc:
        raise BadRequest(f"{label}: not a settlement the store can take ({exc})",
                         param=label.lstrip("-")) from None
    return settlement


async def unfreeze(store: OperatorStore, counter: str) -> bool:
    """Lift the freeze on one counter or account: True if it was frozen, False if it
    was not (nothing changed); :class:`NotFound` if the store has no such counter."""
    if await store.unfreeze(counter):
        return True
    if await store.counter(counter) is None:
        raise NotFound(f"counter {counter!r}: no such counter or account "
                       "(see mayu accounts frozen)")
    return False


def _stored(info: PermitInfo | None) -> str:
    if info is None:
        return "an unknown outcome"
    text = f"{info.status}: committed {info.tokens_committed} tokens, {_usd(info.usd_committed)}"
    return f"{text}{f' ({info.detail})' if info.detail else ''}"


def _usd(micros: int | None) -> str:
    """The CLI's dollar wording (``$0.00``, ``$1.5``): the refusal reads the same from
    either door."""
    if micros is None:
        return "-"
    whole, frac = divmod(micros, 1_000_000)
    return f"${whole}.{f'{frac:06d}'.rstrip('0').ljust(2, '0')}"
