"""The control plane's side of the lease profile: ``POST /v1alpha1/sync`` and the ledger.

One heartbeat is one transaction (``inferplane_lease_sync_v1`` in ``sql/lease.sql``):
the plane's record (API versions, applied generation, rejections), then, per reported
account in lock order, the report adopted and the lease granted, in the same
``authority_accounts`` rows shared-profile admission uses. This module decides what the
SQL cannot know: which reported accounts belong to a lease-managed budget rule of the
published generation, with which limit, grant size and renew interval. It compiles each
generation once (:class:`PolicyCache`), so a heartbeat costs one round trip (the ledger
call); the SQL refuses limits computed from a generation that is no longer published,
and the heartbeat is then recomputed from the new one.

A plane is trusted only with what it could honestly report (issue 25). Before the
ledger moves anything: a plane id belongs to the data-plane token that first synced it
(another configured token is refused, 409), and a new frame — fresh counters, whose
adoption turns the old allowance into liability — is refused while the plane is live
or, once the plane had an adoption, sooner than ``lease.frame_change_interval_s`` after
its current frame's first heartbeat (409); an accepted
one is logged as an alarm and counted. Per account: a committed figure lower than the
one already reported in the frame is refused (never adopted); an account must be a real
window of a published rule (the current UTC day/month, or the adjacent one within
:data:`gateway.lease.WINDOW_GRACE_S` of the boundary) and of a team the heartbeat says
its key store has; a plane opens at most ``lease.max_accounts_per_plane`` ledger rows in
those windows. Every refusal names the token(s) in inferplaned's log and counts in
:mod:`controlplane.metrics`.

Budget rules without ``lease:`` knobs are lease-managed with ADR-032's defaults: a
grant of 0.1% of the limit (at least 1 µUSD) and the 60 s default cadence. The grant is
the floor of what a plane that asks is granted; the size follows the plane's ``want``
(what its admissions needed), and a plane's ``cap`` returns what it does not need
(``gateway.lease._ledger``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
from psycopg.types.json import Jsonb

import sql
from controlplane.auth import Identity
from controlplane.metrics import ControlPlaneMetrics
from controlplane.settings import LeaseSettings
from gateway.db import Pool, connection, fetch_one
from gateway.errors import GovernanceUnavailable, InferplaneError
from gateway.governance import CounterKey, utc_windows
from gateway.lease import (
    DEFAULT_HEARTBEAT_MS,
    EXPIRY_RENEWALS,
    WINDOW_GRACE_S,
    AccountReport,
    DataPlaneView,
    Ignored,
    LeaseGrant,
    SyncRequest,
    SyncResponse,
)
from gateway.policy import CompiledRule, compile_documents, current, tightest_renew_ms

log = logging.getLogger("inferplaned.leases")
_WHAT = "lease ledger"
_RETRIES = 3
DEFAULT_GRANT_PER_MILLE = 1
"""ADR-032's default grant: 0.1% of the limit."""
_LOGGED_MAX = 10_000


class PlaneConflict(InferplaneError):
    """This data plane id is held by another token or another counter store."""

    status = 409
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "dataplane_conflict"

    def __init__(self, message: str, *, retry_after: int | None = None,
                 answer: SyncResponse | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.answer = answer
        """For a refused new frame: the policy pull without leases, so the plane
        enforces the published set (its FailClosed hard caps gate for want of a lease)
        instead of serving ungoverned until its frame is accepted."""


class PolicyView(msgspec.Struct, frozen=True, kw_only=True):
    """One published generation, compiled once for every heartbeat that needs it."""

    namespace: str
    generation: int
    fingerprint: str
    documents: dict[str, dict[str, Any]]
    rules: dict[str, CompiledRule]
    heartbeat_ms: int


class PolicyCache:
    """The compiled published generation, reloaded only when it is no longer published.

    A heartbeat does not read the generation first: ``inferplane_lease_sync_v1`` compares
    the generation the limits were computed from with ``policy_state`` under its lock and
    answers ``stale_generation`` when a publish landed, and only then is it reloaded.
    """

    def __init__(self) -> None:
        self._view: PolicyView | None = None

    def invalidate(self) -> None:
        self._view = None

    async def get(self, conn: psycopg.AsyncConnection[Any]) -> PolicyView:
        if self._view is not None:
            return self._view
        published = await current(conn)
        names = sorted(published.documents)
        rules = compile_documents([published.documents[n] for n in names], origins=names)
        view = PolicyView(namespace=published.namespace, generation=published.generation,
                          fingerprint=published.fingerprint, documents=published.documents,
                          rules={r.uid: r for r in rules},
                          heartbeat_ms=tightest_renew_ms(rules) or DEFAULT_HEARTBEAT_MS)
        self._view = view
        return view


def lease_managed(rule: CompiledRule | None) -> bool:
    return (rule is not None and rule.kind == "budget" and not rule.unlimited
            and rule.limit_micro_usd is not None)


def grant_micro_usd(rule: CompiledRule) -> int:
    limit = rule.limit_micro_usd or 0
    if rule.lease_grant_micro_usd is not None:
        return rule.lease_grant_micro_usd
    return max(1, limit * DEFAULT_GRANT_PER_MILLE // 1000)


def open_periods(now: datetime, *, grace_s: float = WINDOW_GRACE_S
                 ) -> dict[str, frozenset[str]]:
    """The periods a report may name at ``now``, by window: the current day and month,
    plus the previous one within ``grace_s`` after its end and the next one within
    ``grace_s`` before its start (late settlements, leases fetched before midnight)."""
    now = now.astimezone(UTC)
    grace = timedelta(seconds=grace_s)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    first = midnight.replace(day=1)
    next_first = (first + timedelta(days=32)).replace(day=1)
    days = {midnight}
    months = {first}
    if now - midnight < grace:
        days.add(midnight - timedelta(days=1))
    if midnight + timedelta(days=1) - now < grace:
        days.add(midnight + timedelta(days=1))
    if now - first < grace:
        months.add((first - timedelta(days=1)).replace(day=1))
    if next_first - now < grace:
        months.add(next_first)
    return {"day": frozenset(d.strftime("%Y-%m-%d") for d in days),
            "month": frozenset(m.strftime("%Y-%m") for m in months)}


def _team_of(scope: str) -> str | None:
    """The team a ``team=a`` or ``team=a,user=u`` scope charges (None for ``user=u``)."""
    if not scope.startswith("team="):
        return None
    team, _, _ = scope[5:].partition(",user=")
    return team


def _entry(r: AccountReport, name: CounterKey, rule: CompiledRule | None, managed: bool,
           view: PolicyView) -> dict[str, Any]:
    """The ledger input of one account (``limit`` null: record only, no grant)."""
    on = managed and rule is not None
    return {"key": r.key, "rule_uid": r.rule_uid, "scope": name.scope,
            "window": name.window, "period": name.period,
            "limit": rule.limit_micro_usd if on and rule else None,
            "hard": rule.hard_cap if on and rule else True,
            "grant": grant_micro_usd(rule) if on and rule else 0,
            "renew_ms": (rule.lease_renew_ms if on and rule and rule.lease_renew_ms
                         else view.heartbeat_ms),
            "committed": r.committed, "liability": r.liability, "reserved": r.reserved,
            "want": r.want, "need": r.need, "cap": r.cap}


def ledger_accounts(view: PolicyView, req: SyncRequest, *, now: datetime | None = None,
                    granted: tuple[str, ...] | None = None,
                    ) -> tuple[list[dict[str, Any]], list[tuple[str, Ignored]]]:
    """The ledger input for each reported account, and the reports left out (reason
    code, and what the plane is told). ``granted``: the teams the plane's token may
    report for (None: any the heartbeat lists)."""
    periods = open_periods(now or datetime.now(UTC))
    teams = set(req.teams)
    out: list[dict[str, Any]] = []
    ignored: list[tuple[str, Ignored]] = []
    seen: set[str] = set()

    def skip(code: str, key: str, reason: str) -> None:
        ignored.append((code, Ignored(key=key, reason=reason)))

    for r in req.accounts:
        name = CounterKey.parse(r.key)
        if name is None or name.subject != "account" or name.id != r.rule_uid:
            skip("key", r.key, f"not an account key of rule {r.rule_uid!r}")
            continue
        if r.key in seen:
            skip("duplicate", r.key, "reported twice in one heartbeat")
            continue
        seen.add(r.key)
        window = name.window or "day"
        if name.period not in periods[window]:
            skip("period", r.key, f"{window} {name.period!r} is not an open window (the "
                                  f"control plane accepts {sorted(periods[window])})")
            continue
        team = _team_of(name.scope)
        if granted is not None and team not in granted:
            skip("not_granted", r.key, f"team {team!r} is not one this plane's token may "
                                       "report for (auth.dataplane_tokens_ref.<token>.teams)"
                 if team is not None else "this plane's token may report only for its "
                                          "teams' accounts")
            continue
        if team is not None and team not in teams:
            skip("team", r.key, f"team {team!r} is not one of this plane's key store "
                                "(the heartbeat's teams)")
            continue
        rule = view.rules.get(r.rule_uid)
        managed = lease_managed(rule) and rule is not None and rule.window == name.window
        # A user is named by its team (team=a,user=u) for user and team-user rules alike.
        if managed and rule is not None and not rule.fits_scope(name.scope):
            skip("scope", r.key, f"scope {name.scope!r} is not one rule {r.rule_uid!r} "
                                 "applies to")
            continue
        # A rule that is gone (or no longer a budget) still records the figures of rows
        # the plane has (its spend is history); the SQL opens no new row for it.
        out.append(_entry(r, name, rule, managed, view))
    return out, ignored


_REFUSED = {
    "went_backwards": "committed {reported} is below {committed}, already reported in "
                      "this frame: refused, not adopted (a plane's counters only grow "
                      "within a frame; fresh counters come with a new frame)",
    "not_managed": "no lease-managed budget rule of the published generation has this "
                   "account",
    "too_many_accounts": "this plane already holds {cap} ledger rows in the open windows "
                         "(lease.max_accounts_per_plane)",
}


def _refused(x: dict[str, Any], cap: int) -> tuple[str, Ignored]:
    code = str(x["refused"])
    reason = _REFUSED.get(code, code).format(cap=cap, reported=x.get("reported"),
                                             committed=x.get("committed"))
    return code, Ignored(key=str(x["key"]), reason=reason)


@dataclass
class Ledger:
    """The heartbeat's collaborators: pool, compiled generation, limits, tokens, metrics."""

    pool: Pool
    cache: PolicyCache
    settings: LeaseSettings
    tokens: tuple[str, ...]
    """Every configured data-plane token's name."""
    metrics: ControlPlaneMetrics
    _logged: dict[tuple[str, str, str], None] = field(default_factory=dict)

    def _limits(self, now: datetime) -> dict[str, Any]:
        periods = open_periods(now)
        return {"tokens": list(self.tokens),
                "frame_change_ms": int(self.settings.frame_change_interval_s * 1000),
                "max_accounts": self.settings.max_accounts_per_plane,
                "periods": sorted(periods["day"] | periods["month"])}

    def _request(self, req: SyncRequest, identity: Identity, view: PolicyView,
                 accounts: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
        dp = req.dataplane
        return {"generation": view.generation, "accounts": accounts,
                "limits": self._limits(now),
                "dataplane": {"id": dp.id, "token_name": identity.name, "build": dp.build,
                              "api_versions": dp.api_versions, "frame": req.frame,
                              "boot": req.boot, "seq": req.seq,
                              "applied_generation": req.applied_generation,
                              "rejections": msgspec.to_builtins(req.rejections),
                              "heartbeat_ms": view.heartbeat_ms}}

    async def sync(self, req: SyncRequest, identity: Identity) -> SyncResponse:
        """Apply one heartbeat and answer it (the policy pull, leases, windows)."""
        for _ in range(_RETRIES):
            now = datetime.now(UTC)
            async with connection(self.pool, _WHAT) as conn:
                view = await self.cache.get(conn)
                accounts, ignored = ledger_accounts(view, req, now=now,
                                                    granted=identity.teams)
                row = await fetch_one(conn, sql.lease_queries["lease_sync"], {
                    "req": Jsonb(self._request(req, identity, view, accounts, now))})
            assert row is not None
            result: dict[str, Any] = row["result"]
            if result["status"] != "stale_generation":
                break
            self.cache.invalidate()  # a publish landed between reading and applying
        else:
            raise GovernanceUnavailable("the policy generation changed during every try "
                                        "of this heartbeat; retry", retry_after=1)
        self._refuse_plane(req, identity, result, view=view, now=now)
        self.metrics.heartbeats.inc()
        self._note_plane(req, identity, result)
        ignored += [_refused(x, self.settings.max_accounts_per_plane)
                    for x in result.get("refused", [])]
        for code, item in ignored:
            self.metrics.account_refusals.labels(reason=code).inc()
            self._log_once(req.dataplane.id, identity.name, code, item)
        return SyncResponse(
            namespace=view.namespace, generation=view.generation,
            fingerprint=view.fingerprint,
            documents=None if req.fingerprint == view.fingerprint else view.documents,
            heartbeat_ms=view.heartbeat_ms, day=result["day"], month=result["month"],
            leases=[msgspec.convert(x, LeaseGrant) for x in result["leases"]],
            ignored=[i for _, i in ignored], applied=result["status"] == "ok")

    def refuse_token(self, req: SyncRequest, identity: Identity, exc: Exception) -> None:
        """Log and count a heartbeat refused because its token may not name its plane."""
        self.metrics.sync_refusals.labels(reason="plane_not_allowed").inc()
        log.warning("lease sync refused: token %r may not report for data plane %r "
                    "(frame %s): %s", identity.name, req.dataplane.id, req.frame, exc)

    def _refuse_plane(self, req: SyncRequest, identity: Identity, result: dict[str, Any],
                      *, view: PolicyView, now: datetime) -> None:
        status = result["status"]
        if status not in ("token_conflict", "frame_live", "frame_rate"):
            return
        self.metrics.sync_refusals.labels(reason=status).inc()
        plane, holder = req.dataplane.id, result.get("holder")
        if status == "token_conflict":
            message = (f"data plane {plane!r} belongs to token {holder!r}; token "
                       f"{identity.name!r} may not sync for it")
            retry = None
        elif status == "frame_live":
            message = (f"data plane {plane!r} is live in another counter store (last "
                       f"heartbeat {result.get('last_heartbeat')}); a new frame is accepted "
                       f"only once it has been silent for {EXPIRY_RENEWALS} heartbeat "
                       "intervals")
            retry = max(1, view.heartbeat_ms // 1000)
        else:
            message = (f"data plane {plane!r} changed its counter store at "
                       f"{result.get('frame_since')}; the next new frame is accepted "
                       f"from {result.get('retry_at')} (lease.frame_change_interval_s)")
            retry = int(self.settings.frame_change_interval_s)
        log.warning("lease sync refused (%s): %s (token %r, holder token %r, frame %s, "
                    "held frame %s)", status, message, identity.name, holder, req.frame,
                    result.get("frame"))
        answer = None
        if status != "token_conflict":
            day, month = utc_windows(now)
            answer = SyncResponse(
                namespace=view.namespace, generation=view.generation,
                fingerprint=view.fingerprint,
                documents=None if req.fingerprint == view.fingerprint else view.documents,
                heartbeat_ms=view.heartbeat_ms, day=day, month=month, applied=False)
        raise PlaneConflict(message, retry_after=retry, answer=answer)

    def _note_plane(self, req: SyncRequest, identity: Identity,
                    result: dict[str, Any]) -> None:
        holder = result.get("holder")
        if holder and holder != identity.name and result["status"] == "ok":
            log.warning("data plane %r moves from token %r (no longer configured) to "
                        "token %r", req.dataplane.id, holder, identity.name)
        if result.get("new_frame"):
            # Expected after a wiped data dir; repeated, it means two processes share
            # one id, or a token is burning budget on purpose.
            self.metrics.frame_changes.inc()
            log.warning("ALARM lease frame change: data plane %r (token %r) came back with "
                        "another counter store (frame %s, was %s): its earlier spend stays "
                        "committed and the rest of its old allowances count as unobserved "
                        "liability until their windows end", req.dataplane.id,
                        identity.name, req.frame, result.get("previous_frame"))

    def _log_once(self, plane: str, token: str, code: str, item: Ignored) -> None:
        """A refused account at WARNING the first time per (plane, key, reason) in this
        process (a plane re-reports it every heartbeat), at DEBUG afterwards."""
        seen = (plane, item.key, code)
        first = seen not in self._logged
        if first:
            if len(self._logged) >= _LOGGED_MAX:
                self._logged.clear()
            self._logged[seen] = None
        if code == "not_granted":  # a report beyond the token's grant: an alarm
            log.log(logging.ERROR if first else logging.DEBUG,
                    "ALARM lease report beyond its grant refused: data plane %r (token %r) "
                    "reported %s: %s", plane, token, item.key, item.reason)
            return
        log.log(logging.WARNING if first else logging.DEBUG,
                "lease account refused for data plane %r (token %r): %s: %s", plane, token,
                item.key, item.reason)


async def dataplanes(pool: Pool) -> list[DataPlaneView]:
    """Every data plane that ever synced, with its ledger rows; ``connected`` while its
    last heartbeat is younger than its leases' expiry (3 heartbeat intervals)."""
    async with connection(pool, _WHAT) as conn:
        row = await fetch_one(conn, sql.lease_queries["lease_dataplanes"])
    assert row is not None
    planes = msgspec.convert(row["planes"], list[DataPlaneView], strict=False)
    now = datetime.now(UTC)
    return [msgspec.structs.replace(p, connected=now - p.last_heartbeat < timedelta(
        milliseconds=EXPIRY_RENEWALS * (p.heartbeat_ms or DEFAULT_HEARTBEAT_MS)))
        for p in planes]
