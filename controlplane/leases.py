"""The control plane's side of the lease profile: ``POST /v1alpha1/sync`` and the ledger.

One heartbeat is one transaction (``inferplane_lease_sync_v1`` in ``sql/lease_v1.sql``):
the plane's record (API versions, applied generation, rejections), then, per reported
account in lock order, the report adopted and the lease granted, in the same
``authority_accounts`` rows shared-profile admission uses. This module decides what the
SQL cannot know: which reported accounts belong to a lease-managed budget rule of the
published generation, with which limit, grant size and renew interval. It compiles each
generation once (:class:`PolicyCache`), so a heartbeat costs one round trip (the ledger
call); the SQL refuses limits computed from a generation that is no longer published,
and the heartbeat is then recomputed from the new one.

Budget rules without ``lease:`` knobs are lease-managed with ADR-032's defaults: a
grant of 0.1% of the limit (at least 1 µUSD) and the 60 s default cadence.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
from psycopg.types.json import Jsonb

import sql
from gateway.db import Pool, connection, fetch_one
from gateway.errors import BadRequest, GovernanceUnavailable
from gateway.governance import CounterKey
from gateway.lease import (
    DEFAULT_HEARTBEAT_MS,
    EXPIRY_RENEWALS,
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
MAX_ACCOUNTS = 10_000
"""Accounts one heartbeat may report (a bound on the work of one transaction)."""
DEFAULT_GRANT_PER_MILLE = 1
"""ADR-032's default grant: 0.1% of the limit."""


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


def scope_fits(rule: CompiledRule, scope: str) -> bool:
    """Whether ``scope`` is one the rule's subject can charge (``team=a``, ``user=u``,
    ``team=a,user=u``), so a plane cannot report an account the rule could not have."""
    if rule.subject == "team":
        return scope.startswith("team=") and rule.team in ("*", scope[5:])
    if rule.subject == "user":
        return scope.startswith("user=") and rule.user in ("*", scope[5:])
    team, sep, user = scope.partition(",user=")
    return (bool(sep) and team.startswith("team=") and rule.team in ("*", team[5:])
            and rule.user in ("*", user))


def grant_micro_usd(rule: CompiledRule) -> int:
    limit = rule.limit_micro_usd or 0
    if rule.lease_grant_micro_usd is not None:
        return rule.lease_grant_micro_usd
    return max(1, limit * DEFAULT_GRANT_PER_MILLE // 1000)


def ledger_accounts(view: PolicyView, reports: list[AccountReport]
                    ) -> tuple[list[dict[str, Any]], list[Ignored]]:
    """The ledger input for each reported account, and the reports left out (why)."""
    out: list[dict[str, Any]] = []
    ignored: list[Ignored] = []
    seen: set[str] = set()
    for r in reports:
        name = CounterKey.parse(r.key)
        if name is None or name.subject != "account" or name.id != r.rule_uid:
            ignored.append(Ignored(key=r.key, reason="not an account key of rule "
                                                     f"{r.rule_uid!r}"))
            continue
        if r.key in seen:
            ignored.append(Ignored(key=r.key, reason="reported twice in one heartbeat"))
            continue
        seen.add(r.key)
        rule = view.rules.get(r.rule_uid)
        managed = lease_managed(rule) and rule is not None and rule.window == name.window
        if managed and rule is not None and not scope_fits(rule, name.scope):
            ignored.append(Ignored(key=r.key, reason=f"scope {name.scope!r} is not one rule "
                                                     f"{r.rule_uid!r} applies to"))
            continue
        # A rule that is gone (or no longer a budget) still records the plane's figures:
        # its spend is history, it just takes no new grant (limit null).
        out.append({
            "key": r.key, "rule_uid": r.rule_uid, "scope": name.scope,
            "window": name.window, "period": name.period,
            "limit": rule.limit_micro_usd if managed and rule else None,
            "hard": rule.hard_cap if managed and rule else True,
            "grant": grant_micro_usd(rule) if managed and rule else 0,
            "renew_ms": (rule.lease_renew_ms if managed and rule and rule.lease_renew_ms
                         else view.heartbeat_ms),
            "committed": r.committed, "liability": r.liability, "reserved": r.reserved,
            "want": r.want})
    return out, ignored


def _ledger_request(req: SyncRequest, token_name: str, view: PolicyView,
                    accounts: list[dict[str, Any]]) -> dict[str, Any]:
    dp = req.dataplane
    return {"generation": view.generation, "accounts": accounts,
            "dataplane": {"id": dp.id, "token_name": token_name, "build": dp.build,
                          "api_versions": dp.api_versions, "frame": req.frame,
                          "boot": req.boot, "seq": req.seq,
                          "applied_generation": req.applied_generation,
                          "rejections": msgspec.to_builtins(req.rejections),
                          "heartbeat_ms": view.heartbeat_ms}}


async def sync(pool: Pool, cache: PolicyCache, req: SyncRequest, *,
               token_name: str) -> SyncResponse:
    """Apply one heartbeat and answer it (the policy pull, leases, windows)."""
    if len(req.accounts) > MAX_ACCOUNTS:
        raise BadRequest(f"accounts: at most {MAX_ACCOUNTS} per heartbeat")
    for _ in range(_RETRIES):
        async with connection(pool, _WHAT) as conn:
            view = await cache.get(conn)
            accounts, ignored = ledger_accounts(view, req.accounts)
            row = await fetch_one(conn, sql.lease_queries["lease_sync"], {
                "req": Jsonb(_ledger_request(req, token_name, view, accounts))})
        assert row is not None
        result: dict[str, Any] = row["result"]
        if result["status"] != "stale_generation":
            break
        cache.invalidate()  # a publish landed between reading and applying: recompute
    else:
        raise GovernanceUnavailable("the policy generation changed during every try of "
                                    "this heartbeat; retry", retry_after=1)
    if result.get("new_frame"):
        # Expected after a wiped data dir; repeated, it means two processes share one id.
        log.warning("data plane %s came back with another counter store (frame %s, was %s): "
                    "its earlier spend stays committed and the rest of its old allowances "
                    "count as unobserved", req.dataplane.id, req.frame,
                    result.get("previous_frame"))
    return SyncResponse(
        namespace=view.namespace, generation=view.generation,
        fingerprint=view.fingerprint,
        documents=None if req.fingerprint == view.fingerprint else view.documents,
        heartbeat_ms=view.heartbeat_ms, day=result["day"], month=result["month"],
        leases=[msgspec.convert(x, LeaseGrant) for x in result["leases"]],
        ignored=ignored, applied=result["status"] == "ok")


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
