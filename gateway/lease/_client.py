"""The lease profile's policy source and heartbeat (ADR-034 §1, §5).

:class:`LeaseClient` is the gateway's :class:`gateway.policy.PolicySource` in the lease
profile: it serves the last applied policy set and runs one background task that
``POST``\\ s ``/v1alpha1/sync`` on the control plane's cadence (the tightest lease
``renewInterval``, else 60 s). One heartbeat carries the cumulative figures of every
lease-managed account the plane holds or needs (current and previous UTC windows), the
applied generation and the per-document rejections, and brings back the policy set (when
its fingerprint moved) and the leases.

Boot never waits for the control plane: :meth:`LeaseClient.start` installs the set saved
by the last run (if any) and the first heartbeat goes out at once, in the background.
Through an outage the plane keeps its applied set and leases; lease *expiry* (3 renew
intervals) is what flips FailClosed hard caps to refusing, while the loop retries with a
capped backoff. A heartbeat also goes out early, at most every ``min_interval_s``, when
the request path asks (a missing lease, an allowance below half a grant, one used up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import msgspec
from msgspec.structs import replace

from gateway import __version__
from gateway.governance import CounterKey, utc_windows
from gateway.keys import KeyStore
from gateway.lease._apply import apply_documents
from gateway.lease._local import LeaseFile, SavedPolicy
from gateway.lease._state import LeaseState
from gateway.lease._wire import (
    SUPPORTED_API_VERSIONS,
    SYNC_PATH,
    AccountReport,
    DataPlaneInfo,
    SyncRequest,
    SyncResponse,
)
from gateway.policy import PolicySnapshot

log = logging.getLogger("mayu.policy.lease")
_TEAMS_TTL_S = 30.0


class SyncFailed(Exception):
    """The control plane did not answer the heartbeat with a sync response."""


def _previous_periods(now: datetime) -> tuple[str, str]:
    day, _ = utc_windows(now - timedelta(days=1))
    first = now.replace(day=1)
    _, month = utc_windows(first - timedelta(days=1))
    return day, month


class LeaseClient:
    """Policy source + heartbeat of a lease-profile plane."""

    def __init__(self, *, url: str, token: str | None, dataplane_id: str | None,
                 default_id: str, state: LeaseState, lease_file: LeaseFile,
                 key_store: KeyStore | None = None,
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
        self._timeout = timeout_s
        self._min_interval = min_interval_s
        self._max_interval = max_interval_s
        self._max_backoff = max_backoff_s
        self._boot = uuid.uuid4().hex
        self._seq = 0
        self._frame = ""
        self._received = ""
        """Fingerprint of the published set last received (not necessarily all applied)."""
        self._http: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._teams: tuple[float, list[str]] = (float("-inf"), [])
        self.heartbeats = 0
        self.failures = 0

    # -- PolicySource ----------------------------------------------------------------

    def snapshot(self) -> PolicySnapshot:
        return self.state.applied.snapshot

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
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="lease-heartbeat")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        await self._file.close()

    # -- the heartbeat -----------------------------------------------------------------

    async def _loop(self) -> None:
        backoff, failing = 0.0, 0
        while True:
            started = time.monotonic()
            self.state.wake.clear()
            try:
                await self.sync_once()
                if failing:
                    log.info("lease sync with %s works again after %d failed tries",
                             self._url, failing)
                backoff, failing = 0.0, 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                failing += 1
                backoff = min(self._max_backoff, max(0.25, backoff * 2))
                # The first failure, then about once a minute while it lasts.
                if failing == 1 or failing % max(1, int(60 / self._max_backoff)) == 0:
                    log.warning("policy refresh failed: lease sync with %s (%s: %s); keeping "
                                "generation %d and the current leases, retrying every "
                                "%.2fs (%d tries so far)", self._url, type(exc).__name__, exc,
                                self.state.applied.snapshot.generation, backoff, failing)
                await asyncio.sleep(backoff)
                continue
            interval = self._interval_s()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.state.wake.wait(), interval)
            # Early heartbeats are spaced: one burst of refusals asks once.
            await asyncio.sleep(max(0.0, self._min_interval - (time.monotonic() - started)))

    async def sync_once(self) -> SyncResponse:
        """One heartbeat: report, renew, pull; raises :class:`SyncFailed` on no answer."""
        assert self._http is not None, "start() first"
        request = await self._request()
        sent = time.monotonic()
        try:
            r = await self._http.post(SYNC_PATH, content=msgspec.json.encode(request),
                                      headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            raise SyncFailed(f"{type(exc).__name__}: {exc}") from exc
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
        return SyncRequest(
            dataplane=DataPlaneInfo(id=self._id, build=f"mayu {__version__}",
                                    api_versions=list(SUPPORTED_API_VERSIONS)),
            frame=self._frame, boot=self._boot, seq=self._seq, fingerprint=self._received,
            applied_generation=applied.snapshot.generation,
            rejections=list(applied.rejections), accounts=await self._accounts())

    def _interval_s(self) -> float:
        return min(self._max_interval, self.state.heartbeat_ms / 1000)

    async def _accounts(self) -> list[AccountReport]:
        """Every account to report: local counters of lease-managed rules (current and
        previous windows), the ones requests asked for, and the current-window accounts
        of team rules for the teams this plane knows (leased before their first use);
        within two heartbeats of a window's end, the next window's accounts too."""
        now = datetime.now(UTC)
        day, month = utc_windows(now)
        managed = {uid for uid, m in self.state.managed_rules().items() if m.gate is None}
        figures = await self._file.figures((day, month, *_previous_periods(now)))
        wanted: dict[str, tuple[str, int]] = {}
        for key in figures:
            uid = _uid_of(key, managed)
            if uid is not None:
                wanted[key] = (uid, 0)
        for key, (uid, want) in self.state.take_demand().items():
            if uid in managed:
                wanted[key] = (uid, max(want, wanted.get(key, (uid, 0))[1]))
        for key, uid in (await self._team_accounts(day, month)).items():
            wanted.setdefault(key, (uid, 0))
        ahead = utc_windows(now + timedelta(seconds=2 * self._interval_s()))
        if ahead != (day, month):
            # Lease the coming window now: the first requests after midnight find their
            # leases instead of a refusal while one is fetched.
            for key, uid in (await self._team_accounts(*ahead)).items():
                wanted.setdefault(key, (uid, 0))
            for key, (uid, _) in list(wanted.items()):
                rolled = _rolled(key, (day, month), ahead)
                if rolled != key:
                    wanted.setdefault(rolled, (uid, 0))
        out = []
        for key in sorted(wanted):
            uid, want = wanted[key]
            f = figures.get(key)
            out.append(AccountReport(key=key, rule_uid=uid, want=want,
                                     committed=f.committed if f else 0,
                                     liability=f.liability if f else 0,
                                     reserved=f.reserved if f else 0))
        return out

    async def _team_accounts(self, day: str, month: str) -> dict[str, str]:
        rules = [r for r in self.state.applied.snapshot.rules
                 if r.uid in self.state.managed_rules() and r.subject == "team"
                 and self.state.managed_rules()[r.uid].gate is None]
        if not rules:
            return {}
        teams = await self._team_names() if any(r.team == "*" for r in rules) else []
        out = {}
        for r in rules:
            period = day if r.window == "day" else month
            for team in ([r.team] if r.team and r.team != "*" else teams):
                account = CounterKey.account(r.uid, f"team={team}", r.window or "day", period)
                out[account.text] = r.uid
        return out

    async def _team_names(self) -> list[str]:
        at, names = self._teams
        if self._keys is None or time.monotonic() - at < _TEAMS_TTL_S:
            return names
        try:
            names = [t.name for t in await self._keys.list_teams()]
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

    def _install(self, saved: SavedPolicy) -> None:
        applied = apply_documents(saved.documents, namespace=saved.namespace,
                                  generation=saved.generation, fingerprint=saved.fingerprint)
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


def _uid_of(key: str, uids: set[str]) -> str | None:
    """The managed rule uid an ``account:<uid>:...`` key belongs to."""
    account = CounterKey.parse(key)
    if account is None or account.subject != "account":
        return None
    return account.id if account.id in uids else None
