"""The app factory and its lifespan: stores, pool, providers and policy source.

:func:`create_app` builds the Litestar app (a :class:`gateway.ingress.GatewayApp`, which
serves the generation routes below Litestar's request and response objects); the
lifespan opens everything the request path needs and closes it in reverse order. The
component factory picks stores by profile: local (SQLite key store + local governance in
``<data_dir>/mayu.db``), lease (the same, bounded by budget leases from inferplaned:
:mod:`gateway.lease`) or shared (Postgres, imported lazily so the local profile needs no
database driver or server).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from litestar import Litestar

from gateway.admin import OPENAPI, AdminAccess
from gateway.admin import ROUTES as ADMIN_ROUTES
from gateway.alerts import BudgetAlerts, WebhookSender
from gateway.audit import AuditLog
from gateway.config import Settings, resolve_secret
from gateway.console import ROUTES as CONSOLE_ROUTES
from gateway.console import TEMPLATES as CONSOLE_TEMPLATES
from gateway.errors import ConfigError, InferplaneError
from gateway.governance import (
    GovernanceStore,
    Governor,
    Journal,
    Permit,
    Settlement,
    SettleResult,
    utc_windows,
)
from gateway.guardrails import warm_presidio
from gateway.ingress import (
    ROUTES,
    Gateway,
    GatewayApp,
    Resolver,
    error_handler,
    refuse_nul_bytes,
)
from gateway.keys import KeyStore
from gateway.metrics import CREDENTIALS_LOGGER, POLICY_LOGGERS, Metrics
from gateway.otlp_import import ROUTES as OTLP_ROUTES
from gateway.otlp_import import (
    PostgresReportStore,
    ReportStore,
    SqliteReportStore,
    prune_reports_forever,
)
from gateway.policy import PolicySource, StaticPolicySource, deployment_routing_names
from gateway.providers import Provider, build_providers
from gateway.replicas import audit_path, journal_path, orphan_journals, worker_settings
from gateway.standalone import standalone_warning
from gateway.tasks import cancel_and_wait
from gateway.telemetry import Telemetry, start_telemetry

if TYPE_CHECKING:  # the Postgres driver is imported only by the shared profile
    from gateway.db import Pool
    from gateway.lease import UsageSpool

log = logging.getLogger("mayu")

PRINCIPAL_TTL_S = 5.0
"""How long a resolved key plans admitted requests where admission re-checks it (saves
the key lookup; a revoked, expired or edited key is refused by admission's own check and
resolved afresh: ``gateway.ingress.Resolver.to_admit``)."""


def _principal_ttl_s(settings: Settings) -> float:
    """PRINCIPAL_TTL_S where admission checks the key and team revisions itself: the
    shared profile (under its locks, DESIGN §4), and the local profile when keys and
    counters share one SQLite file (under its write lock); else 0 (resolve each time)."""
    if settings.shared:
        return PRINCIPAL_TTL_S
    if settings.control_plane is not None:
        return 0.0
    same_file = (_local_path(settings, settings.key_store.path)
                 == _local_path(settings, settings.governance_store.path))
    return PRINCIPAL_TTL_S if same_file else 0.0


@dataclass
class Components:
    """What the request path talks to; supplied by tests, else built from settings."""

    key_store: KeyStore
    governance: GovernanceStore
    policy: PolicySource
    providers: dict[str, Provider] | None = None
    pool: Pool | None = None
    """The shared profile's pool (budget alerts and the cluster gauges read through it)."""
    usage_spool: UsageSpool | None = None
    """The lease profile's usage spool (its figures on /metrics)."""


def _local_path(settings: Settings, configured: str | None) -> str:
    return os.path.expanduser(configured or os.path.join(settings.data_dir, "mayu.db"))


async def build_components(settings: Settings, stack: AsyncExitStack) -> Components:
    """Open the profile's stores; ``stack`` closes them at shutdown."""
    if settings.shared:
        return await _shared_components(settings, stack)
    from gateway.governance import LocalGovernanceStore
    from gateway.keys import SqliteKeyStore, rotation_secrets

    # The data dir is its owner's only (0700), as the files in it (0600).
    os.makedirs(os.path.expanduser(settings.data_dir), mode=0o700, exist_ok=True)
    keys = SqliteKeyStore(_local_path(settings, settings.key_store.path),
                          rotation_secrets=rotation_secrets(settings))
    await keys.open()
    stack.push_async_callback(keys.close)
    if settings.control_plane is not None:
        return await _lease_components(settings, keys, stack)
    governance = LocalGovernanceStore(_local_path(settings, settings.governance_store.path),
                                      max_batch=settings.governance_store.max_batch)
    await governance.open()
    stack.push_async_callback(governance.close)
    return Components(key_store=keys, governance=governance, policy=_policy_source(settings))


async def _lease_components(settings: Settings, keys: KeyStore,
                            stack: AsyncExitStack) -> Components:
    """The lease profile: local stores, clamped and gated by leases from inferplaned."""
    from gateway.lease import (
        LeaseClient,
        LeaseFile,
        LeaseGovernanceStore,
        LeaseState,
        UsageSpool,
    )

    cp = settings.control_plane
    assert cp is not None
    token = resolve_secret(cp.token_ref, key="control_plane.token_ref") if cp.token_ref else None
    path = _local_path(settings, settings.governance_store.path)
    state = LeaseState()
    governance = LeaseGovernanceStore(path, state=state,
                                      max_batch=settings.governance_store.max_batch)
    await governance.open()
    stack.push_async_callback(governance.close)
    client = LeaseClient(
        url=cp.url, token=token, state=state, lease_file=LeaseFile(path), key_store=keys,
        deployments={m.name: deployment_routing_names(m) for m in settings.models},
        dataplane_id=_dataplane_id(cp.dataplane_id),
        default_id=settings.server.replica_id or socket.gethostname(),
        timeout_s=cp.timeout_s, min_interval_s=cp.min_heartbeat_interval_s,
        max_interval_s=cp.max_heartbeat_interval_s)
    # Each settled request's usage record, shipped to inferplaned (docs/lease.md).
    spool = UsageSpool(path, url=cp.url, token=token, key_store=keys,
                       timeout_s=max(cp.timeout_s, 5.0))
    await spool.open()
    stack.push_async_callback(spool.close)
    await spool.start()
    return Components(key_store=keys, governance=governance, policy=client,
                      usage_spool=spool)


def _dataplane_id(configured: str | None) -> str | None:
    """``control_plane.dataplane_id``: a name, or ``env:NAME`` (a DaemonSet passes the
    node name through the downward API, so each node's plane keeps one id)."""
    if configured is None or not configured.startswith("env:"):
        return configured
    value = os.environ.get(configured[4:], "").strip()
    if not value:
        raise ConfigError(f"control_plane.dataplane_id: environment variable "
                          f"{configured[4:]} is not set")
    return value


def check_policy_source(settings: Settings) -> None:
    """Refuse local policy files in the shared profile.

    Shared admission compares each request's policy generation with the database's
    ``policy_state``; a file source numbers its own generations, so every request would
    be refused as a snapshot mismatch. The database is the one policy authority there.
    """
    if settings.shared and settings.policies:
        raise ConfigError("policies: not used in the shared profile, whose policies live in "
                          "the database (publish them with inferplaned); remove the key")


async def _shared_components(settings: Settings, stack: AsyncExitStack) -> Components:
    from gateway.db import durability_check, open_pool
    from gateway.governance import (
        PostgresGovernanceStore,
        PostgresPolicySource,
    )
    from gateway.keys import PostgresKeyStore, rotation_secrets
    from gateway.schema import check_schema

    assert settings.database is not None  # load_settings refuses shared mode without it
    check_policy_source(settings)
    pool = open_pool(settings.database)
    wait_s = settings.database.connect_timeout_s + 5
    try:
        await pool.open(wait=True, timeout=wait_s)
    except Exception as exc:
        await pool.close()
        raise ConfigError(f"database.dsn_ref: no connection to the database within "
                          f"{wait_s:g}s ({type(exc).__name__}: {exc})") from exc
    stack.push_async_callback(pool.close)
    await check_schema(pool)
    await durability_check(pool)  # warns loudly; docs/failover.md
    policy = PostgresPolicySource(pool, refresh_s=settings.database.policy_refresh_s)
    governance = PostgresGovernanceStore(
        pool, coalesce=settings.database.admission_coalesce,
        settle_coalesce=settings.database.settlement_coalesce,
        merge=settings.database.merge_batches)
    # Runs before pool.close (the stack unwinds last in, first out): the connections
    # the store keeps between its calls go back to the pool first.
    stack.push_async_callback(governance.close)
    return Components(key_store=PostgresKeyStore(pool,
                                                 rotation_secrets=rotation_secrets(settings)),
                      governance=governance,
                      policy=policy, pool=pool)


def _policy_source(settings: Settings) -> PolicySource:
    if settings.policies:
        from gateway.policy import FilePolicySource

        source: PolicySource = FilePolicySource(settings.policies)
        return source
    return StaticPolicySource()


def _count_policy_errors(metrics: Metrics, stack: AsyncExitStack) -> None:
    """Policy sources report sync failures by logging; count them as metrics."""
    handler = metrics.policy_log_handler()
    for name in POLICY_LOGGERS:
        logging.getLogger(name).addHandler(handler)
        stack.callback(logging.getLogger(name).removeHandler, handler)
    # Provider credential sources (gateway.providers._credentials) report the same way.
    counting = metrics.credentials_log_handler()
    logging.getLogger(CREDENTIALS_LOGGER).addHandler(counting)
    stack.callback(logging.getLogger(CREDENTIALS_LOGGER).removeHandler, counting)


async def _seed_budget(metrics: Metrics, governance: GovernanceStore) -> None:
    """Local profile: this process is the only admitter (or, with ``server.workers``,
    worker 0, the others counting from zero: the gauges are summed), so start the budget
    utilisation from the store's totals for today (a restart does not reset it)."""
    day, month = utc_windows(datetime.now(UTC))
    try:
        metrics.budget.seed(await governance.usage(day=day, month=month), day)
    except Exception as exc:  # a metric must not stop the gateway from starting
        log.warning("budget utilisation starts from zero: usage unavailable (%s)", exc)


async def _start_alerts(settings: Settings, comps: Components, metrics: Metrics,
                        audit: AuditLog, stack: AsyncExitStack) -> BudgetAlerts | None:
    """Budget alerts (ADR-050) deduplicated where the profile keeps its counters: the
    shared database, or the local SQLite file. Not in the lease profile, where a plane's
    counters hold only its own share of a budget."""
    config = settings.server.alerts
    if not config.enabled:
        return None
    from gateway.alerts import AlertStore, PostgresAlertStore, SqliteAlertStore
    from gateway.governance import LocalGovernanceStore

    store: AlertStore
    if comps.pool is not None:
        store = PostgresAlertStore(comps.pool)
    elif (settings.control_plane is None and type(comps.governance) is LocalGovernanceStore):
        store = SqliteAlertStore(comps.governance.path)
    else:
        log.info("budget alerts: off (the lease profile's counters are one plane's share)")
        return None
    webhook = None
    if config.webhook_url is not None and config.secret_ref is not None:
        webhook = WebhookSender(
            config.webhook_url,
            secret=resolve_secret(config.secret_ref, key="server.alerts.secret_ref"),
            timeout_s=config.timeout_s, retries=config.retries,
            retry_backoff_s=config.retry_backoff_s)
    alerts = BudgetAlerts(store, replica=settings.server.replica_id or socket.gethostname(),
                          metrics=metrics, audit=audit, webhook=webhook)
    await alerts.start()
    # Closed after the Governor (registered before it): shutdown settlements are checked.
    stack.push_async_callback(alerts.close)
    return alerts


async def _start_governor(settings: Settings, store: GovernanceStore, metrics: Metrics,
                          audit: AuditLog, stack: AsyncExitStack,
                          alerts: BudgetAlerts | None = None,
                          orphans: list[str] | None = None,
                          keys: Resolver | None = None) -> Governor:
    """The permit owner, with this replica's journal and the ``keys`` admission re-reads
    after a snapshot mismatch; what a previous run left open is resolved before the
    gateway serves (Governor.start), and so is what the journals no process of this run
    owns left open (``orphans``: :mod:`gateway.replicas`)."""
    server = settings.server

    def journal(path: str) -> Journal:
        return Journal(path, fsync=server.journal_fsync,
                       fsync_interval_s=server.journal_fsync_interval_s)

    def settled(permit: Permit, settlement: Settlement, result: SettleResult | None,
                error: str | None, late: bool) -> None:
        metrics.settle_backlog.set(governor.backlog)
        if result is not None:
            metrics.settled(permit, settlement, stored=True)
            if alerts is not None:
                alerts.settled(permit, settlement)
        if late and result is not None:
            # The request's own audit line said "stored": false; this is the store's answer.
            audit.write({"event": "settlement_replayed", "permit": permit.id,
                         "request_id": permit.request.request_id,
                         "outcome": str(settlement.kind),
                         "tokens_committed": result.tokens_committed,
                         "usd_committed": result.usd_committed,
                         "tokens_liability": result.tokens_liability,
                         "usd_liability": result.usd_liability,
                         "detail": settlement.detail})

    for path in orphans or ():
        await _adopt(Governor(store, journal=journal(path), on_settled=settled), path)
    governor = Governor(store, keys=keys, journal=journal(journal_path(settings)),
                        settle_wait_s=server.settle_wait_s, on_settled=settled)
    governor.admission_seconds = metrics.admission_latency.observe
    governor.settlement_seconds = metrics.settlement_latency.observe
    await governor.start()
    # Registered after the stores (closed first): open permits settle before they close.
    stack.push_async_callback(governor.close)
    return governor


async def _adopt(governor: Governor, path: str) -> None:
    """Resolve what a journal no process of this run owns left open, as its own replica
    would at startup; one another live process holds (its lock) is left to it."""
    try:
        await governor.start()
    except ConfigError:
        log.info("journal %s: in use by another process, left to it", path)
        return
    left = governor.backlog
    await governor.close()
    if left:
        log.warning("journal %s (no worker of this run owns it): %d settlement(s) "
                    "waiting for the store, replayed at the next start", path, left)


def _start_retention(settings: Settings, store: GovernanceStore, stack: AsyncExitStack,
                     worker: tuple[int, int] | None) -> None:
    """With ``governance_store.retention_days``, prune the request log hourly
    (gateway/governance/_retention.py); one worker of a ``mayu serve`` does it."""
    days = settings.governance_store.retention_days
    if days is None or (worker is not None and worker[0] != 0):
        return
    from gateway.governance import Prunable, prune_forever

    prunable: Prunable = store  # type: ignore[assignment]  # both stores prune
    task = asyncio.get_running_loop().create_task(prune_forever(prunable, days))

    stack.push_async_callback(cancel_and_wait, task)


def _start_telemetry(settings: Settings, metrics: Metrics, stack: AsyncExitStack) -> Telemetry:
    """OTLP spans and metrics when ``telemetry:`` is set (docs/telemetry.md); else off."""
    conf = settings.telemetry
    if conf is None:
        return start_telemetry(None, registry=metrics.registry)
    headers = {**conf.headers, **{name: resolve_secret(ref, key=f"telemetry.header_refs.{name}")
                                  for name, ref in conf.header_refs.items()}}
    replica = settings.server.replica_id or socket.gethostname()
    telemetry = start_telemetry(
        conf, registry=metrics.registry, headers=headers, instance=f"{replica}:{os.getpid()}",
        providers={p.name: (p.kind, p.base_url) for p in settings.providers},
        refresh=metrics.cluster.refresh if metrics.cluster.reader is not None else None)
    stack.push_async_callback(telemetry.aclose)
    return telemetry


async def _open_agent_usage(settings: Settings, comps: Components, stack: AsyncExitStack,
                            worker: tuple[int, int] | None) -> ReportStore:
    """Where the agents' own usage reports go (gateway/otlp_import): beside the request
    log, in the shared database or the local file; pruned with it (one worker of a
    ``mayu serve`` does it)."""
    store: ReportStore = (
        PostgresReportStore(comps.pool) if comps.pool is not None
        else SqliteReportStore(_local_path(settings, settings.governance_store.path)))
    await store.open()
    stack.push_async_callback(store.close)
    days = settings.governance_store.retention_days
    if days is not None and (worker is None or worker[0] == 0):
        task = asyncio.get_running_loop().create_task(prune_reports_forever(store, days))
        # Stopped before the store closes (last in, first out).
        stack.push_async_callback(cancel_and_wait, task)
    return store


def create_app(settings: Settings, *, components: Components | None = None,
               worker: tuple[int, int] | None = None,
               adopt_journals: bool = False) -> Litestar:
    """The gateway as an ASGI app; the lifespan owns whatever it opens.

    ``worker``: (index, count) when this process is worker ``index`` of a ``mayu
    serve`` with ``server.workers: count`` (``settings`` are then that worker's, from
    :func:`gateway.replicas.worker_settings`); ``adopt_journals``: resolve the journals
    of this replica no process of this run owns (``mayu serve`` asks for it)."""
    base = settings
    if worker is not None:
        settings = worker_settings(base, worker[0])

    async def start(app: Litestar, stack: AsyncExitStack) -> Gateway:
        # Secrets first: a bad reference fails before anything is opened or created.
        admin = (resolve_secret(settings.server.admin_token_ref, key="server.admin_token_ref")
                 if settings.server.admin_token_ref else None)
        app.state.admin = AdminAccess.from_settings(settings.server)
        comps = components or await build_components(settings, stack)
        providers = comps.providers or build_providers(settings.providers)
        for provider in providers.values():
            await provider.start()
            stack.push_async_callback(provider.close)
        metrics = Metrics(team_labels=settings.server.metrics_team_labels)
        if comps.usage_spool is not None:
            metrics.registry.register(comps.usage_spool.collector())
        _count_policy_errors(metrics, stack)
        if not settings.shared and (worker is None or worker[0] == 0):
            # Workers: their gauges are summed, so one of them starts from the day's total.
            await _seed_budget(metrics, comps.governance)
        await comps.policy.start()
        stack.push_async_callback(comps.policy.stop)
        server = settings.server
        audit = AuditLog(audit_path(settings), fsync=server.audit_fsync,
                         fsync_interval_s=server.audit_fsync_interval_s,
                         max_bytes=server.audit_max_bytes, keep=server.audit_keep)
        audit.open()
        audit.start()
        stack.push_async_callback(audit.aclose)
        if comps.pool is not None:
            from gateway.cluster_metrics import postgres_reader

            metrics.cluster.reader = postgres_reader(comps.pool)
        alerts = await _start_alerts(settings, comps, metrics, audit, stack)
        orphans = orphan_journals(base, worker) if adopt_journals else []
        resolver = Resolver(comps.key_store, comps.policy, metrics,
                            principal_ttl_s=_principal_ttl_s(settings))
        governor = await _start_governor(settings, comps.governance, metrics, audit, stack,
                                         alerts, orphans, keys=resolver)
        _start_retention(settings, comps.governance, stack, worker)
        app.state.agent_usage = await _open_agent_usage(settings, comps, stack, worker)
        if settings.guardrails.presidio is not None:  # spaCy loads here, not on a request
            await warm_presidio(settings.guardrails.presidio)
        telemetry = _start_telemetry(settings, metrics, stack)
        return Gateway(settings=settings, key_store=comps.key_store,
                       governance=comps.governance, policy=comps.policy,
                       providers=providers, metrics=metrics, audit=audit,
                       admin_token=admin, governor=governor,
                       principal_ttl_s=resolver.principal_ttl_s, resolver=resolver,
                       pool=comps.pool,
                       alerts=alerts.store if alerts is not None else None,
                       telemetry=telemetry)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            try:
                app.state.gateway = await start(app, stack)
            except InferplaneError as exc:
                # One plain line naming the config key, above the server's traceback.
                log.error("startup failed: %s", exc.message)
                raise
            stack.callback(setattr, app.state, "gateway", None)
            profile = ("shared" if settings.shared else
                       "lease" if settings.control_plane is not None else "local")
            log.info("mayu ready: %s profile, audit %s", profile,
                     app.state.gateway.audit.path)
            warning = standalone_warning(settings)
            if warning and (worker is None or worker[0] == 0):  # once per serve
                log.warning(warning)
            yield

    # GatewayApp: a Litestar app whose generation routes are served below it (ingress._asgi).
    return GatewayApp(route_handlers=[*ROUTES, *ADMIN_ROUTES, *CONSOLE_ROUTES, *OTLP_ROUTES],
                      template_config=CONSOLE_TEMPLATES, lifespan=[lifespan],
                      exception_handlers={Exception: error_handler},
                      before_request=refuse_nul_bytes,
                      request_max_body_size=None, openapi_config=OPENAPI,
                      logging_config=None)
