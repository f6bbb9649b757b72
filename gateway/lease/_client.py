"""The lease profile's policy source and heartbeat (ADR-034 §1, §5).

:class:`LeaseClient` is the gateway's :class:`gateway.policy.PolicySource` in the lease
profile: it serves the last applied policy set and runs one background task that
``POST``\\ s ``/v1alpha1/sync`` on the control plane's cadence (the tightest lease
``renewInterval``, else 60 s). One heartbeat carries the cumulative figures of every
lease-managed account the plane holds or needs (the current UTC windows, and the
previous ones shortly after they end), the teams of the plane's key store (the control
plane leases no other team), the applied generation and the per-document rejections,
and brings back the policy set (when its fingerprint moved) and the leases. A plane
leases only the teams its key store has: a rule naming a team it does not have parks no
budget here, and a team created later gets its lease through the missing-lease path
(its first request asks, and the team list is re-read for that heartbeat).

Boot never waits for the control plane: :meth:`LeaseClient.start` installs the set saved
by the last run (if any) and the first heartbeat goes out at once, in the background.
Through an outage the plane keeps its applied set and leases; lease *expiry* (3 renew
intervals) is what flips FailClosed hard caps to refusing, while the loop retries with a
capped backoff. A heartbeat also goes out early, at most every ``min_interval_s``, when
the request path asks (a missing lease, an allowance below half a grant, one used up);
the request that asked waits for its answer (:class:`gateway.lease.LeaseGovernanceStore`).
Each account's report asks for what its admissions needed over the last renew interval
and releases what the plane holds but does not need (:mod:`gateway.lease._state`).
Routine heartbeats log at DEBUG (httpx's request line for the sync URL included).

The answer also carries inferplaned's brokered keys of the plane's teams and the deny
list when they changed (``SyncResponse.people``, docs/identity.md): the plane holds them
in its key store (hashes only), so a credential verified here resolves to its person's
key, and a revoked person's key is revoked here by the first answer after the revoke.
A verified credential whose key the plane does not hold yet asks for an early heartbeat
and waits for its answer (:meth:`LeaseClient.await_brokered_key`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import httpx
import msgspec
from msgspec.structs import replace

from gateway import __version__
from gateway.governance import CounterKey, utc_windows
from gateway.keys import KeyStore
from gateway.lease._apply import apply_documents
from gateway.lease._background import Background, Retry
from gateway.lease._local import Figures, LeaseFile, SavedPolicy
from gateway.lease._state import LeaseState
from gateway.lease._wire import (
    MAX_ACCOUNTS,
    MAX_KEY,
    MAX_NAME,
    MAX_PROBLEMS,
    MAX_REJECTIONS,
    MAX_TEAM_NAME,
    MAX_TEAMS,
    MAX_TEXT,
    SUPPORTED_API_VERSIONS,
    SYNC_PATH,
    WINDOW_GRACE_S,
    AccountReport,
    DataPlaneInfo,
    People,
    Problem,
    Rejection,
    SyncRequest,
    SyncResponse,
)
from gateway.policy import PolicySnapshot

log = logging.getLogger("mayu.policy.lease")
_HTTPX_LOG = logging.getLogger("httpx")
_TEAMS_TTL_S = 30.0
_TEAMS_FRESH_S = 1.0
"""At most this often, a heartbeat re-reads the key store's teams for a request of a
team it does not know yet (a team created since the last read)."""


class SyncFailed(Exception):
    """The control plane did not answer the heartbeat with a sync response."""


def _previous_periods(now: datetime) -> tuple[str, ...]:
    """The previous day and month while the control plane still takes their reports
    (within half its grace after their end, for clocks apart)."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    first = midnight.replace(day=1)
    half = timedelta(seconds=WINDOW_GRACE_S / 2)
    out: list[str] = []
    if now - midnight < half:
        out.append(utc_windows(midnight - timedelta(days=1))[0])
    if now - first < half:
        out.append(utc_windows(first - timedelta(days=1))[1])
    return tuple(out)


class _Refused(msgspec.Struct, frozen=True, kw_only=True):
    """A 409 answer to a heartbeat: the error, and the policy pull when there is one."""

    answer: SyncResponse | None = None


class _QuietSync(logging.Filter):
    """httpx's INFO request line for the sync URL, demoted to DEBUG (one per heartbeat)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self._url = url

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and self._url in record.getMessage():
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return _HTTPX_LOG.isEnabledFor(logging.DEBUG)
        return True


class LeaseClient(Background):
    """Policy source + heartbeat of a lease-profile plane."""

    def __init__(self, *, url: str, token: str | None, dataplane_id: str | None,
                 default_id: str, state: LeaseState, lease_file: LeaseFile,
                 key_store: KeyStore | None = None,
                 deployments: Mapping[str, Sequence[str]] | None = None,
                 timeout_s: float = 5.0, min_interval_s: float = 0.05,
                 max_interval_s: float = 60.0, max_backoff_s: float = 5.0) -> None:
        self.state = state
        self._url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._configured_id = dataplane_id
        self._default_id = default_id
        self._id = dataplane_id or default_id
        self._file = lease_file
        self._keys = key_store
        self._deployments = deployments
        """This plane's models → their deployments' routing names: a RoutingPolicy naming
        another is rejected (:func:`gateway.lease.apply_documents`)."""
        self._timeout = timeout_s
        self._min_interval = min_interval_s
        self._max_interval = max_interval_s
        self._max_backoff = max_backoff_s
        self._boot = uuid.uuid4().hex
        self._seq = 0
        self._frame = ""
        self._received = ""
        """Fingerprint of the published set last received (not necessarily all applied)."""
        self._people = ""
        """Fingerprint of the brokered keys last held (:class:`People`)."""
        self._key_asked: float | None = None
        """When a credential last named a key this plane does not hold: the next heartbeat
        lists the key store's teams as read after that moment (a team created just before
        has its keys sent), whatever the read throttle."""
        self._http: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._teams: tuple[float, list[str]] = (float("-inf"), [])
        self._quiet = _QuietSync(f"{self._url}{SYNC_PATH}")
        self.heartbeats = 0
        self.failures = 0
        state.answer_wait_s = timeout_s + min_interval_s

    # -- PolicySource ----------------------------------------------------------------

    def snapshot(self) -> PolicySnapshot:
        return self.state.applied.snapshot

    @property
    def dataplane_id(self) -> str:
        """The id this plane reports to inferplaned."""
        return self._id

    async def start(self) -> None:
        """Install the last applied set (if a run saved one) and start heartbeating."""
        self._frame, self._id = await self._file.open(dataplane_id=self._configured_id,
                                                      default_id=self._default_id)
        saved = await self._file.saved_policy()
        if saved is not None:
            self._install(saved)
            log.info("lease profile: enforcing saved policy generation %d until the "
                     "control plane answers", saved.generation)
        self._http = httpx.AsyncClient(base_url=self._url, timeout=self._timeout,
                                       headers=self._headers)
        _HTTPX_LOG.addFilter(self._quiet)
        self._start_loop("lease-heartbeat")

    async def stop(self) -> None:
        await self._stop_loop()
        _HTTPX_LOG.removeFilter(self._quiet)
        await self._file.close()

    # -- the heartbeat -----------------------------------------------------------------

    async def _loop(self) -> None:
        retry = Retry(floor=0.25, ceiling=self._max_backoff)
        while True:
            started = time.monotonic()
            self.state.wake.clear()
            try:
                await self.sync_once()
                if failed := retry.succeeded():
                    log.info("lease sync with %s works again after %d failed tries",
                             self._url, failed)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                backoff = retry.failed()
                # The first failure, then about once a minute while it lasts.
                if retry.failing == 1 or retry.failing % max(1, int(60 / self._max_backoff)) == 0:
                    log.warning("policy refresh failed: lease sync with %s (%s: %s); keeping "
                                "generation %d and the current leases, retrying every "
                                "%.2fs (%d tries so far)", self._url, type(exc).__name__, exc,
                                self.state.applied.snapshot.generation, backoff, retry.failing)
                await asyncio.sleep(backoff)
                continue
            interval = self._interval_s()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.state.wake.wait(), interval)
            # Early heartbeats are spaced: one burst of refusals asks once.
            await asyncio.sleep(max(0.0, self._min_interval - (time.monotonic() - started)))

    async def sync_once(self) -> SyncResponse:
        """One heartbeat: report, renew, pull; raises :class:`SyncFailed` on no answer."""
        answered = False
        try:
            answer = await self._sync()
            answered = True
            return answer
        finally:
            # Requests waiting for this answer are decided again (or refused, unanswered).
            self.state.beat_ended(answered=answered)

    async def _sync(self) -> SyncResponse:
        assert self._http is not None, "start() first"
        request = await self._request()
        sent = time.monotonic()
        try:
            r = await self._http.post(SYNC_PATH, content=msgspec.json.encode(request),
                                      headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            raise SyncFailed(f"{type(exc).__name__}: {exc}") from exc
        if r.status_code == 409:
            # A new frame refused (this id is live elsewhere, or changed frames too
            # recently): the body still carries the policy pull, without leases, so the
            # plane enforces the published set (FailClosed hard caps gate) meanwhile.
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                refused = msgspec.json.decode(r.content, type=_Refused)
                if refused.answer is not None:
                    await self._take(refused.answer, sent=sent)
        if r.status_code != 200:
            raise SyncFailed(f"HTTP {r.status_code}: {r.text[:300]}")
        try:
            answer = msgspec.json.decode(r.content, type=SyncResponse)
        except msgspec.DecodeError as exc:
            raise SyncFailed(f"not a sync response: {exc}") from exc
        await self._take(answer, sent=sent)
        self.heartbeats += 1
        return answer

    async def _request(self) -> SyncRequest:
        self._seq += 1
        applied = self.state.applied
        accounts, teams = await self._accounts()
        # The protocol's bounds (the control plane refuses a larger heartbeat): the first
        # ones in order; what is left out is logged.
        for what, count, bound in (("accounts", len(accounts), MAX_ACCOUNTS),
                                   ("teams", len(teams), MAX_TEAMS)):
            if count > bound:
                log.warning("lease profile: %d %s to report, the heartbeat carries the "
                            "first %d", count, what, bound)
        return SyncRequest(
            dataplane=DataPlaneInfo(id=self._id, build=f"mayu {__version__}",
                                    api_versions=list(SUPPORTED_API_VERSIONS)),
            frame=self._frame, boot=self._boot, seq=self._seq, fingerprint=self._received,
            applied_generation=applied.snapshot.generation,
            rejections=[_bounded(r) for r in applied.rejections[:MAX_REJECTIONS]],
            accounts=accounts[:MAX_ACCOUNTS], teams=teams[:MAX_TEAMS], people=self._people)

    def _interval_s(self) -> float:
        return min(self._max_interval, self.state.heartbeat_ms / 1000)

    async def _accounts(self) -> tuple[list[AccountReport], list[str]]:
        """Every account to report, and the key store's teams: local counters of
        lease-managed rules (current windows, previous ones shortly after they end), the
        ones requests asked for, and the current-window accounts of team rules for the
        teams of the key store (leased before their first use); within two heartbeats of
        a window's end, the next window's accounts too. A team-scoped account of a team
        the key store does not have is never reported (the control plane would ignore
        it: it leases a plane only its own teams)."""
        now = datetime.now(UTC)
        day, month = utc_windows(now)
        managed = {uid for uid, m in self.state.managed_rules().items() if m.gate is None}
        # One step, before the figures are read: what requests asked, and the leases
        # this heartbeat releases frozen (their cap then bounds everything it reports).
        demand = self.state.take_demand()
        self.state.beat_begun()
        releasing = self.state.release(demand)
        figures = await self._file.figures((day, month, *_previous_periods(now)))
        asked, self._key_asked = self._key_asked, None
        teams = await self._team_names(read_after=asked)
        if any(t is not None and t not in teams for t in map(_team_of, demand)):
            teams = await self._team_names(fresh=True)  # a team created since the read
        known = set(teams)
        wanted: dict[str, tuple[str, int]] = {}
        for key in figures:
            uid = _uid_of(key, managed)
            if uid is not None:
                wanted[key] = (uid, 0)
        for key, (uid, want) in demand.items():
            if uid in managed:
                wanted[key] = (uid, max(want, wanted.get(key, (uid, 0))[1]))
        for key, uid in self._team_accounts(day, month, teams).items():
            wanted.setdefault(key, (uid, 0))
        ahead = utc_windows(now + timedelta(seconds=2 * self._interval_s()))
        if ahead != (day, month):
            # Lease the coming window now: the first requests after midnight find their
            # leases instead of a refusal while one is fetched.
            for key, uid in self._team_accounts(*ahead, teams).items():
                wanted.setdefault(key, (uid, 0))
            for key, (uid, _) in list(wanted.items()):
                rolled = _rolled(key, (day, month), ahead)
                if rolled != key:
                    wanted.setdefault(rolled, (uid, 0))
        out = []
        for key in sorted(wanted):
            team = _team_of(key)
            if (team is not None and team not in known) or not _sendable(key, MAX_KEY):
                continue
            uid, need = wanted[key]
            f = figures.get(key) or Figures(0, 0, 0)
            cap = None
            lease = self.state.leases.get(key)
            if key in releasing and lease is not None:
                cap = min(lease.allowance, sum(f) + releasing[key])
            out.append(AccountReport(key=key, rule_uid=uid, want=self.state.want(key, need),
                                     need=need, cap=cap, committed=f.committed,
                                     liability=f.liability, reserved=f.reserved))
        return out, teams

    def _team_accounts(self, day: str, month: str, teams: list[str]) -> dict[str, str]:
        """The accounts of the applied team rules for the key store's ``teams`` only (a
        rule naming a team this plane does not have leases nothing here)."""
        managed = self.state.managed_rules()
        rules = [r for r in self.state.applied.snapshot.rules
                 if r.uid in managed and r.subject == "team" and managed[r.uid].gate is None]
        known = set(teams)
        out = {}
        for r in rules:
            period = day if r.window == "day" else month
            for team in ([r.team] if r.team and r.team != "*" else teams):
                if team in known:
                    account = CounterKey.account(r.uid, f"team={team}", r.window or "day",
                                                 period)
                    out[account.text] = r.uid
        return out

    async def _team_names(self, *, fresh: bool = False,
                          read_after: float | None = None) -> list[str]:
        """The key store's team names (sorted), re-read every ``_TEAMS_TTL_S`` — or, when
        ``fresh``, at most every ``_TEAMS_FRESH_S``; always when the last read is older
        than ``read_after`` (a credential's request asked after it: at most one re-read
        per early heartbeat, which ``min_interval_s`` spaces)."""
        at, names = self._teams
        age = time.monotonic() - at
        stale = read_after is not None and at < read_after
        if self._keys is None or (
                not stale and age < (_TEAMS_FRESH_S if fresh else _TEAMS_TTL_S)):
            return names
        try:
            names = sorted({t.name for t in await self._keys.list_teams()
                            if _sendable(t.name, MAX_TEAM_NAME)})
        except Exception as exc:  # a local read failing must not stop the heartbeat
            log.warning("lease profile: cannot list local teams (%s)", exc)
        self._teams = (time.monotonic(), names)
        return names

    async def _take(self, answer: SyncResponse, *, sent: float) -> None:
        snapshot = self.state.applied.snapshot
        if answer.documents is not None and (answer.fingerprint != snapshot.fingerprint
                                             or answer.namespace != snapshot.namespace):
            saved = SavedPolicy(answer.namespace, answer.generation, answer.fingerprint,
                                answer.documents)
            self._install(saved)
            await self._file.save_policy(saved)
            self.state.wake.set()  # report the new generation and its rejections now
        self._received = answer.fingerprint
        if answer.applied:
            self.state.renewed(answer.leases, sent=sent, heartbeat_ms=answer.heartbeat_ms)
        for ignored in answer.ignored:
            log.warning("lease profile: the control plane ignored account %s: %s",
                        ignored.key, ignored.reason)
        if answer.people is not None:
            await self._hold(answer.people)

    async def _hold(self, people: People) -> None:
        """Hold exactly the brokered keys of ``people`` (revoking the denied ones)."""
        sync = getattr(self._keys, "sync_brokered", None)
        if sync is None:
            return
        try:
            added, revoked = await sync(
                [(k.id, k.team, k.user, k.key_hash, k.brokered, k.name)
                 for k in people.keys],
                [(d.id, d.revoked_at) for d in people.denied], complete=people.complete)
        except Exception as exc:  # the next answer carries them again
            log.warning("lease profile: cannot hold the brokered keys (%s: %s)",
                        type(exc).__name__, exc)
            return
        self._people = people.fingerprint
        if added or revoked:
            log.info("lease profile: brokered keys: %d added, %d revoked (%d active, %d "
                     "on the deny list)", added, revoked, len(people.keys),
                     len(people.denied))

    async def await_brokered_key(self, key_hash: str) -> None:
        """A verified credential names ``key_hash``: when this plane does not hold it yet
        (issued since the last answer), ask for a heartbeat now and wait for its answer
        (at most the request path's bounded wait)."""
        if self._keys is None or self._task is None \
                or await self._keys.resolve(key_hash) is not None:
            return
        self._key_asked = time.monotonic()
        await self.state.next_answer(self.state.ask_answer())

    def _install(self, saved: SavedPolicy) -> None:
        applied = apply_documents(saved.documents, namespace=saved.namespace,
                                  generation=saved.generation, fingerprint=saved.fingerprint,
                                  deployments=self._deployments)
        self.state.applied = applied  # one assignment: readers never see a mix
        self._received = saved.fingerprint
        log.info("lease profile: policy generation %d applied (%d rules, %d documents "
                 "rejected)", saved.generation, len(applied.snapshot.rules),
                 len(applied.rejections))
        for rejection in applied.rejections:
            for problem in rejection.problems:
                log.error("lease profile: policy %s rejected on this data plane: %s: %s",
                          rejection.name, problem.path, problem.message)


def _rolled(key: str, now: tuple[str, str], ahead: tuple[str, str]) -> str:
    """The same account in the coming window (``key`` itself when its window stays, or
    when ``key`` is not of the current window)."""
    account = CounterKey.parse(key)
    if account is None or account.window is None:
        return key
    current, coming = (now[0], ahead[0]) if account.window == "day" else (now[1], ahead[1])
    if account.period != current or coming == current:
        return key
    return replace(account, period=coming).text


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _sendable(text: str, longest: int) -> bool:
    """Whether ``text`` fits the protocol (one bad name would make the heartbeat a 400)."""
    return 0 < len(text) <= longest and _CONTROL.search(text) is None


def _bounded(rejection: Rejection) -> Rejection:
    """``rejection`` within the protocol's bounds (a problem can quote a long value)."""
    return Rejection(name=rejection.name[:MAX_NAME], problems=[
        Problem(path=p.path[:MAX_TEXT], message=p.message[:MAX_TEXT])
        for p in rejection.problems[:MAX_PROBLEMS]])


def _team_of(key: str) -> str | None:
    """The team of a team-scoped account key (``team=a`` or ``team=a,user=u``)."""
    account = CounterKey.parse(key)
    if account is None or account.subject != "account" or not account.scope.startswith(
            "team="):
        return None
    team, _, _ = account.scope[5:].partition(",user=")
    return team


def _uid_of(key: str, uids: set[str]) -> str | None:
    """The managed rule uid an ``account:<uid>:...`` key belongs to."""
    account = CounterKey.parse(key)
    if account is None or account.subject != "account":
        return None
    return account.id if account.id in uids else None
