"""Which counters a request charges, and what a settlement commits to each.

Pure functions shared by every store, so the local and shared profiles enforce the same
limits with the same arithmetic, refuse the same malformed plans and commits, and
fingerprint outcomes alike; only the atomicity differs.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from functools import lru_cache
from typing import NamedTuple

import msgspec

from gateway.ceilings import MAX_AMOUNT, MAX_BUCKET_CAPACITY
from gateway.errors import BadRequest
from gateway.governance._counterkey import CounterKey
from gateway.governance._model import (
    BUCKET_SCALE,
    AdmissionRequest,
    Charge,
    CounterKind,
    Dimension,
    OutcomeKind,
    Settlement,
)
from gateway.keys import MemberLimits, Principal
from gateway.policy import CompiledRule, PolicySnapshot
from gateway.pricing import InvalidUsage


def utc_windows(now: datetime) -> tuple[str, str]:
    """The explicit UTC calendar windows (day, month) that contain ``now``."""
    now = now.astimezone(UTC)
    return _windows(now.year, now.month, now.day)


@lru_cache(maxsize=8)
def _windows(year: int, month: int, day: int) -> tuple[str, str]:
    return f"{year:04d}-{month:02d}-{day:02d}", f"{year:04d}-{month:02d}"


class _OwnKeys(NamedTuple):
    """The counter keys of a key and its team in one day and month."""

    key_rpm: str
    key_tpm: str
    team_rpm: str
    team_tpm: str
    team_tokens_day: str
    key_usd_day: str
    key_usd_month: str
    team_usd_day: str
    team_usd_month: str


@lru_cache(maxsize=4096)
def _own_keys(key_id: str, team_id: str, day: str, month: str) -> _OwnKeys:
    # Cached: every request of a key plans the same keys all day.
    k, t = CounterKey.key(key_id), CounterKey.team(team_id)
    return _OwnKeys(
        key_rpm=k.bucket("rpm").text, key_tpm=k.bucket("tpm").text,
        team_rpm=t.bucket("rpm").text, team_tpm=t.bucket("tpm").text,
        team_tokens_day=t.windowed("tokens", "day", day).text,
        key_usd_day=k.windowed("usd", "day", day).text,
        key_usd_month=k.windowed("usd", "month", month).text,
        team_usd_day=t.windowed("usd", "day", day).text,
        team_usd_month=t.windowed("usd", "month", month).text)


class _PersonKeys(NamedTuple):
    """The counter keys of a member's or a user's budget in one day and month."""

    tokens_day: str
    usd_day: str
    usd_month: str


@lru_cache(maxsize=4096)
def _person_keys(team_id: str | None, user: str, day: str, month: str) -> _PersonKeys:
    # Cached like _own_keys. team_id None: the user's budget across every team.
    who = CounterKey.user(user) if team_id is None else CounterKey.member(team_id, user)
    return _PersonKeys(tokens_day=who.windowed("tokens", "day", day).text,
                       usd_day=who.windowed("usd", "day", day).text,
                       usd_month=who.windowed("usd", "month", month).text)


def _person_charges(limits: MemberLimits | None, team_id: str | None, user: str,
                    token_bound: int, usd_bound: int, day: str, month: str,
                    fit: int | None) -> list[Charge]:
    if limits is None:
        return []
    keys = _person_keys(team_id, user, day, month)
    return [*_window(keys.tokens_day, limits.tokens_per_day, token_bound, day, "tokens",
                     fit=fit),
            *_window(keys.usd_day, limits.usd_micros_per_day, usd_bound, day, "usd", fit=fit),
            *_window(keys.usd_month, limits.usd_micros_per_month, usd_bound, month, "usd",
                     fit=fit)]


class _RuleKeys(NamedTuple):
    """The counter keys of a policy rule for one scope in one day and month."""

    rpm: str
    tpm: str
    tokens_day: str
    tokens_month: str
    account: str
    """The budget's account in the rule's window (``day`` or else ``month``)."""
    in_flight: str


@lru_cache(maxsize=4096)
def _rule_keys(uid: str, scope: str, window: str | None, day: str,
               month: str) -> _RuleKeys:
    # Cached like _own_keys.
    rule = CounterKey.rule(uid, scope)
    account = (CounterKey.account(uid, scope, "day", day) if window == "day"
               else CounterKey.account(uid, scope, "month", month))
    return _RuleKeys(rpm=rule.bucket("rpm").text, tpm=rule.bucket("tpm").text,
                     tokens_day=rule.windowed("tokens", "day", day).text,
                     tokens_month=rule.windowed("tokens", "month", month).text,
                     account=account.text, in_flight=rule.in_flight().text)


def _bucket(counter: str, capacity: int | None, amount: int, *, rule: str | None = None,
            dimension: Dimension = "tokens") -> list[Charge]:
    if not capacity:
        return []
    return [Charge(counter=counter, kind="bucket", dimension=dimension,
                   amount=amount, limit=capacity, rule_uid=rule)]


def _window(counter: str, limit: int | None, amount: int, window: str, dimension: Dimension,
            *, rule: str | None = None, kind: CounterKind = "window",
            hard: bool = True, fit: int | None = None,
            scope: str | None = None) -> list[Charge]:
    if limit is None:
        return []
    return [Charge(counter=counter, kind=kind,
                   dimension=dimension, amount=amount, limit=limit,
                   window=window, rule_uid=rule, hard=hard, fit_floor=fit, scope=scope)]


def _rule_charges(rule: CompiledRule, scope: str, tokens: int, usd: int, day: str,
                  month: str, tpm: int) -> list[Charge]:
    keys = _rule_keys(rule.uid, scope, rule.window, day, month)
    if rule.kind == "rate":
        return (_bucket(keys.rpm, rule.rpm, 1, rule=rule.uid, dimension="requests")
                + _bucket(keys.tpm, rule.tpm, tpm, rule=rule.uid))
    if rule.kind == "concurrency":
        # An in-flight slot: a requests window with no calendar period. Admission
        # reserves 1 against maxInFlight; every settlement commits 0 to it, so the
        # reservation (the slot) is freed whatever the outcome (split_settlement).
        return [Charge(counter=keys.in_flight, kind="window", dimension="requests",
                       amount=1, limit=rule.max_in_flight, rule_uid=rule.uid)]
    if rule.kind == "tokenQuota":
        return (_window(keys.tokens_day, rule.tokens_per_day, tokens, day, "tokens",
                        rule=rule.uid)
                + _window(keys.tokens_month, rule.tokens_per_month, tokens, month,
                          "tokens", rule=rule.uid))
    window = day if rule.window == "day" else month
    return _window(keys.account, rule.limit_micro_usd, usd, window, "usd", rule=rule.uid,
                   kind="account", hard=rule.hard_cap, fit=rule.fit_floor, scope=scope)


def tpm_estimate(body_bytes: int) -> int:
    """ADR-039's TPM estimate: the request body's length / 4 (at least 1 token).

    TPM buckets are charged this at admission and trued up at settlement to the actual
    total of every token class (debt allowed, no floor), so a well-estimated request never
    waits for its worst case; token quotas and money keep their sound bounds.
    """
    return max(1, body_bytes // 4)


def plan_charges(principal: Principal, snapshot: PolicySnapshot, *, token_bound: int,
                 usd_bound: int, now: datetime,
                 tpm: int | None = None) -> tuple[Charge, ...]:
    """Every counter this request must reserve against, sorted by counter key: the key's
    and team's buckets and windows, the user's member and cross-team budgets, and each
    policy rule that applies.

    TPM buckets reserve ``tpm`` (the estimate, :func:`tpm_estimate`; default the token
    bound), token quotas ``token_bound`` and money windows ``usd_bound``. The sort is the
    stable lock order every store uses, so two admissions never wait on each other's rows
    in opposite orders.
    """
    tpm = token_bound if tpm is None else tpm
    fit = principal.team.limits.budget_fit_floor
    day, month = utc_windows(now)
    key, team = principal.key_limits, principal.team.limits
    own = _own_keys(principal.key_id, principal.team.id, day, month)
    charges = [
        *_bucket(own.key_rpm, key.rpm, 1, dimension="requests"),
        *_bucket(own.key_tpm, key.tpm, tpm),
        *_bucket(own.team_rpm, team.rpm, 1, dimension="requests"),
        *_bucket(own.team_tpm, team.tpm, tpm),
        *_window(own.team_tokens_day, team.tokens_per_day, token_bound, day, "tokens",
                 fit=fit),
        *_window(own.key_usd_day, key.usd_micros_per_day, usd_bound, day, "usd"),
        *_window(own.key_usd_month, key.usd_micros_per_month, usd_bound, month, "usd"),
        *_window(own.team_usd_day, team.usd_micros_per_day, usd_bound, day, "usd", fit=fit),
        *_window(own.team_usd_month, team.usd_micros_per_month, usd_bound, month, "usd",
                 fit=fit),
    ]
    if principal.user is not None:
        # The user's budget within the team (member row or the team's default) and
        # across every team; budget fit lowers max_tokens to fit them like the team's.
        charges += _person_charges(principal.member_limits, principal.team.id,
                                   principal.user, token_bound, usd_bound, day, month, fit)
        charges += _person_charges(principal.user_limits, None, principal.user,
                                   token_bound, usd_bound, day, month, fit)
    for rule in snapshot.rules_for(principal.team.name, principal.user, principal.key_id):
        scope = rule.scope(principal.team.name, principal.user, principal.key_id)
        charges += _rule_charges(rule, scope, token_bound, usd_bound, day, month, tpm)
    return tuple(sorted(charges, key=lambda c: c.counter))


def soft_charges(principal: Principal, snapshot: PolicySnapshot, *,
                 now: datetime) -> list[Charge]:
    """The soft budgets (policy ``budget`` rules with ``hardCap: false``) that bind the
    caller, as the accounts :func:`plan_charges` would charge (amounts 0): what routing
    reads to switch a caller past one to its model's cheaper tier (ADR-046)."""
    day, month = utc_windows(now)
    charges: list[Charge] = []
    for rule in snapshot.rules_for(principal.team.name, principal.user, principal.key_id):
        if rule.kind == "budget" and not rule.hard_cap:
            scope = rule.scope(principal.team.name, principal.user, principal.key_id)
            charges += _rule_charges(rule, scope, 0, 0, day, month, 0)
    return charges


def build_request(principal: Principal, snapshot: PolicySnapshot, *, request_id: str,
                  model: str, token_bound: int, usd_bound: int,
                  now: datetime, tpm: int | None = None) -> AdmissionRequest:
    day, month = utc_windows(now)
    return AdmissionRequest(
        request_id=request_id, key_id=principal.key_id, key_revision=principal.key_revision,
        team_id=principal.team.id, team_revision=principal.team.revision,
        user=principal.user, model=model, token_bound=token_bound, usd_bound=usd_bound,
        policy_generation=snapshot.generation,
        charges=plan_charges(principal, snapshot, token_bound=token_bound,
                             usd_bound=usd_bound, now=now, tpm=tpm),
        day=day, month=month)


def refill(balance: int, capacity: int, elapsed_us: int) -> int:
    """A bucket balance (scaled units) after ``elapsed_us`` of refill, never above capacity.

    A debt (negative balance) is repaid by refill like any other shortfall.
    """
    if elapsed_us <= 0:
        return balance
    return min(capacity * BUCKET_SCALE, balance + capacity * elapsed_us)


def bucket_admits(balance: int, capacity: int, amount: int) -> bool:
    """Whether a bucket can take ``amount``: all of it, or a full bucket for an oversize one.

    A request larger than the whole capacity is admitted only from a full bucket and
    leaves it in debt; otherwise it could never run at all.
    """
    return balance >= min(amount, capacity) * BUCKET_SCALE


def bucket_settle(balance: int, capacity: int, reserved: int, committed: int,
                  held_us: int = 0) -> int:
    """True-up (ADR-039): credit back unused (never above capacity) or debit the excess.

    ``held_us`` is how long the reservation was held. Refill during that time may already
    have repaid the reserved tokens, so a credit is reduced by everything refill could have
    added meanwhile: an old reservation's release can never hand a newer request capacity
    the bucket would not have had without it (ADR-046). Debits are never reduced.
    """
    delta = (reserved - committed) * BUCKET_SCALE
    if delta > 0:
        delta = max(0, delta - capacity * max(0, held_us))
    return min(capacity * BUCKET_SCALE, balance + delta)


def retry_after_seconds(balance: int, capacity: int, amount: int) -> int:
    """Whole seconds until a bucket refills enough to take ``amount``."""
    need = min(amount, capacity) * BUCKET_SCALE - balance
    if need <= 0:
        return 0
    micros = -(-need // capacity)
    return max(1, -(-micros // 1_000_000))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_request(req: AdmissionRequest) -> None:
    """Refuse plans whose numbers could not be stored exactly (a caller bug): amounts and
    window limits above ``MAX_AMOUNT``, bucket capacities above ``MAX_BUCKET_CAPACITY``,
    refused before any counter moves."""
    for i, c in enumerate(req.charges):
        where = f"charges[{i}] ({c.counter})"
        if not _is_int(c.amount) or not 0 <= c.amount <= MAX_AMOUNT:
            raise BadRequest(f"{where}.amount: must be an integer in 0..{MAX_AMOUNT}")
        if c.limit is not None and (not _is_int(c.limit) or c.limit < 0):
            raise BadRequest(f"{where}.limit: must be a non-negative integer")
        if c.kind == "bucket" and not (c.limit and c.limit <= MAX_BUCKET_CAPACITY):
            raise BadRequest(f"{where}.limit: bucket capacity must be in "
                             f"1..{MAX_BUCKET_CAPACITY}")
        if c.kind != "bucket" and c.limit is not None and c.limit > MAX_AMOUNT:
            raise BadRequest(f"{where}.limit: above {MAX_AMOUNT}")
    if len({c.counter for c in req.charges}) != len(req.charges):
        raise BadRequest(f"request {req.request_id}: a counter is charged twice")


def check_commit_values(values: dict[str, int], *, what: str = "commits") -> None:
    """Refuse a commit (or liability) that is not an integer a counter stores exactly."""
    for name, value in values.items():
        if not _is_int(value) or not 0 <= value <= MAX_AMOUNT:
            raise InvalidUsage(f"{what}[{name!r}]: must be an integer in 0..{MAX_AMOUNT}, "
                               f"got {value!r}")


def check_settlement(request: AdmissionRequest, s: Settlement) -> None:
    """Refuse a settlement whose parts do not match the permit (a caller bug) or could not
    be stored exactly; INVALID carries no parts (nothing is committed)."""
    if s.kind is OutcomeKind.INVALID:
        return
    charged = {c.counter for c in request.charges}
    for name in sorted(charged - s.commits.keys()):
        raise InvalidUsage(f"commits[{name!r}]: missing for a charged counter")
    for name in sorted((s.commits.keys() | s.liabilities.keys()) - charged):
        raise InvalidUsage(f"commits[{name!r}]: this permit did not charge that counter")
    check_commit_values(s.commits)
    check_commit_values(s.liabilities, what="liabilities")
    totals = {"tokens_committed": s.tokens_committed, "usd_committed": s.usd_committed,
              "tokens_liability": s.tokens_liability, "usd_liability": s.usd_liability}
    check_commit_values(totals, what="settlement")


_encode = msgspec.json.Encoder().encode


def settlement_fingerprint(s: Settlement) -> str:
    """What makes two settlements "the same": kind, totals and every counter's part.

    The SHA-256 of ``json.dumps`` of those parts with compact separators, which is what
    every release has stored. msgspec writes the same bytes for the same values unless
    a string needs an escape, is not ASCII or holds DEL (``json.dumps`` escapes those its
    own way, DEL as ``\\u007f``, which msgspec writes raw), and then ``json.dumps``
    writes them."""
    parts = [str(s.kind), s.tokens_committed, s.usd_committed, s.tokens_liability,
             s.usd_liability, s.bound_exceeded, sorted(s.commits.items()),
             sorted(s.liabilities.items())]
    body = _encode(parts)
    if b"\\" in body or not body.isascii() or b"\x7f" in body:
        body = json.dumps(parts, separators=(",", ":")).encode()
    return hashlib.sha256(body).hexdigest()
