"""The lease ledger's arithmetic (ADR-034 §2), as pure functions.

``sql/lease.sql`` (``inferplane_lease_sync_v1``) executes exactly this under row
locks in Postgres; this module is its specification, mirrored line for line, so the
property tests (hypothesis) can state the invariants on the arithmetic alone and the
integration tests can check the SQL against it.

One :class:`LedgerRow` per (account, data plane), in the plane's current *frame* (the
identity of its counter store):

- ``committed``, ``liability``, ``reserved``: the plane's latest cumulative report;
- ``allowance``: how far the plane may take committed + liability + reserved; grants
  are cumulative allowances, so a retried heartbeat grants nothing twice;
- ``prior_committed`` / ``prior_unobserved``: what earlier frames left. When a plane
  comes back with fresh counters (a new frame: a restart with an empty store), its old
  committed figure stays spend and everything else its old allowance allowed becomes
  *unobserved* (liability: it may have been spent after the last report), so the old
  allowance is never spent again.

Within one frame committed only grows (the plane's counter is cumulative): a lower
figure is refused (:class:`WentBackwards`), never adopted. Adopting it would turn the
row's whole footprint into unobserved liability and grant afresh, so a plane reporting
10, 0, 10, 0 … could burn a budget it never spent. Whether a frame change itself is
allowed (the plane's own token, not live, not too often) is decided before any account
is touched (``inferplane_lease_sync_v1``); this module only does the arithmetic.

The account row (``authority_accounts``, shared with the shared profile's admission)
carries the sums: ``committed`` and ``liability`` include every plane's committed and
liability (current and prior frames), ``leased_outstanding`` every plane's current
footprint beyond them. Shared admission refuses when committed + liability + reserved +
leased_outstanding + amount would pass the limit, so leases and shared admissions
compete for one budget.

Grant (ADR-034's ``allowance′ = spent + min(grant, max(0, remaining))``, refined):

    remaining  = limit − others − held
    allowance′ = max(allowance, held + min(size, max(0, remaining)))

where ``held`` = committed + liability + reserved of this plane's frame and ``others``
is everything else the account binds (shared admissions, other planes' footprints, this
plane's earlier frames). ``size`` is the rule's grant size, raised to the plane's
``want`` (what its recent admissions needed, at least the charge it refused). An allowance never
decreases within a frame while its lease is valid, except by the plane's own word: the
plane may already have admitted up to it before the answer that would lower it arrives,
so lowering it would hand the same µUSD out twice.

**Release.** A plane that holds allowance it does not need (idle, or too little left
for the charge it refused) reports a ``cap``: from before it read the report's figures
until this answer it admits nothing beyond it (it stops admitting on the account, and
the cap counts what was still in flight). The allowance then drops to ``max(cap,
held)``, which returns the rest to the budget at once, and the grant is exactly ``want``
(no rule-size floor) — or nothing when the budget cannot give ``need``, the charge the
plane refused, so a piece too small to use stays in the pool for a plane (or a shared
gateway) that can. Once the lease has *expired* (3 renew intervals without an applied
heartbeat) the plane admits nothing more on it — the plane's own expiry is measured from
the request that got the lease, so it comes no later than the ledger's — and every
admission made before expiry is in the ``held`` of the plane's next report: that report
returns the unused allowance to the budget (the allowance restarts from ``held``, then
takes a fresh grant), instead of holding it until the window ends.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec


class LedgerRow(msgspec.Struct, frozen=True, kw_only=True):
    frame: str = ""
    committed: int = 0
    liability: int = 0
    reserved: int = 0
    allowance: int = 0
    prior_committed: int = 0
    prior_unobserved: int = 0
    adoptions: int = 0

    @property
    def held(self) -> int:
        """What the plane's counter binds right now (spend, liability, in flight)."""
        return self.committed + self.liability + self.reserved

    @property
    def footprint(self) -> int:
        """What this frame may bind in total: its allowance, or more after an overrun."""
        return max(self.allowance, self.held)


class Report(msgspec.Struct, frozen=True, kw_only=True):
    frame: str
    committed: int
    liability: int = 0
    reserved: int = 0


class WentBackwards(ValueError):
    """The report's committed figure is below the one already reported in its frame."""


class Account(msgspec.Struct, frozen=True, kw_only=True):
    """The figures of an ``authority_accounts`` row the ledger reads and moves."""

    committed: int = 0
    liability: int = 0
    reserved: int = 0
    leased_outstanding: int = 0

    @property
    def bound(self) -> int:
        """Everything the account binds against its limit."""
        return self.committed + self.liability + self.reserved + self.leased_outstanding


class Contribution(NamedTuple):
    committed: int
    liability: int
    outstanding: int


def contribution(row: LedgerRow) -> Contribution:
    """What one plane's row adds to its account's committed, liability and leased."""
    return Contribution(row.prior_committed + row.committed,
                        row.prior_unobserved + row.liability,
                        row.footprint - row.committed - row.liability)


def adopt(row: LedgerRow, report: Report, *, expired: bool = False,
          cap: int | None = None) -> LedgerRow:
    """The row after taking ``report`` (its allowance kept unless the frame changed,
    returned to the budget when the row's lease had ``expired``, or lowered to the
    plane's ``cap`` — never below what it holds).

    A new frame means fresh counters: the old frame's committed stays spend, the rest of
    its footprint becomes unobserved, and the new frame starts with no allowance. A lower
    committed figure in the same frame raises :class:`WentBackwards` (the row stays).
    """
    if report.frame == row.frame:
        if report.committed < row.committed:
            raise WentBackwards(f"committed {report.committed} is below {row.committed}, "
                                f"already reported in frame {row.frame!r}")
        allowance = 0 if expired else row.allowance
        held = report.committed + report.liability + report.reserved
        if cap is not None:
            allowance = min(allowance, max(cap, held))
        return msgspec.structs.replace(row, committed=report.committed,
                                       liability=report.liability, reserved=report.reserved,
                                       allowance=allowance)
    return LedgerRow(frame=report.frame, committed=report.committed,
                     liability=report.liability, reserved=report.reserved, allowance=0,
                     prior_committed=row.prior_committed + row.committed,
                     prior_unobserved=row.prior_unobserved + row.footprint - row.committed,
                     adoptions=row.adoptions + (1 if row.frame else 0))


def grant_size(grant: int, want: int, limit: int, *, release: bool = False) -> int:
    """The grant to aim for: the rule's size raised to the plane's ``want``; exactly
    ``want`` when the plane releases."""
    return min(want, limit) if release else max(grant, min(want, limit))


def next_allowance(row: LedgerRow, *, limit: int | None, others: int, size: int,
                   open_: bool, need: int = 0, release: bool = False) -> tuple[int, int]:
    """(allowance′, remaining after it) for ``row`` (already adopted).

    ``others`` is everything the account binds except this row's current frame;
    ``open_`` is False when the account takes no new grant (window ended, rule gone,
    frozen account): the allowance then stays where it is (or at ``held`` after an
    overrun), never lower. A releasing plane gets nothing rather than less than ``need``.
    """
    if limit is None or not open_:
        allowance = max(row.allowance, row.held)
    else:
        extra = min(size, max(0, limit - others - row.held))
        if release and extra < need:
            extra = 0
        allowance = max(row.allowance, row.held + extra)
    left = 0 if limit is None else max(0, limit - others - max(allowance, row.held))
    return allowance, left


class SyncResult(NamedTuple):
    row: LedgerRow
    account: Account
    remaining: int


def sync(row: LedgerRow, report: Report, account: Account, *, limit: int | None,
         grant: int, want: int = 0, open_: bool = True, expired: bool = False,
         cap: int | None = None, need: int = 0) -> SyncResult:
    """One account of one heartbeat: adopt the report, grant, move the account sums
    (raises :class:`WentBackwards`, moving nothing, for a lower figure in one frame)."""
    before = contribution(row)
    adopted = adopt(row, report, expired=expired, cap=cap)
    # Everything but this plane's current frame: its earlier frames stay bound.
    others = (account.bound - before.committed - before.liability - before.outstanding
              + adopted.prior_committed + adopted.prior_unobserved)
    release = cap is not None
    size = grant_size(grant, want, limit or 0, release=release)
    allowance, left = next_allowance(adopted, limit=limit, others=others, size=size,
                                     open_=open_, need=need, release=release)
    new_row = msgspec.structs.replace(adopted, allowance=allowance)
    after = contribution(new_row)
    new_account = Account(
        committed=account.committed + after.committed - before.committed,
        liability=account.liability + after.liability - before.liability,
        reserved=account.reserved,
        leased_outstanding=account.leased_outstanding + after.outstanding
        - before.outstanding)
    return SyncResult(new_row, new_account, left)
