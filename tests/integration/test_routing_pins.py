"""Cache affinity's pins in the shared database (real Postgres): a session pinned by one
replica keeps its deployment on another."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.config import Deployment, ModelSettings
from gateway.routing import Router, session_of

MODEL = msgspec.convert({"name": "m", "routing": {
    "affinity": True, "on_affinity_conflict": "preferFallback"},
    "deployments": [{"provider": p} for p in ("a", "b", "c")]}, ModelSettings)


def _cands() -> list[tuple[Deployment, str]]:
    return [(d, d.provider) for d in MODEL.deployments]


async def test_a_session_keeps_its_deployment_across_replicas(pg_pool: Any) -> None:
    """Replica one pins the session where it landed; replica two, which never saw it,
    reads that pin and puts the same deployment first; only hashes are stored."""
    one, two = Router(), Router()
    one.share(pg_pool)
    two.share(pg_pool)
    session = session_of("m", {"x-claude-code-session-id": "s-1"}, {})
    assert session is not None
    await one.recall(MODEL, session)
    plan = one.plan(MODEL, _cands(), session=session)
    landed = plan.order[1]  # not the balancer's first choice: a real decision to keep
    plan.served(landed[0])
    assert one.shared is not None
    await one.shared.drain()
    for _ in range(3):  # replica two's own round robin would move it
        await two.recall(MODEL, session)
        assert two.plan(MODEL, _cands(), session=session).order[0] == landed
    async with pg_pool.connection() as conn:
        rows = await (await conn.execute(
            "SELECT model, session_key, deployment FROM routing_pins")).fetchall()
    assert [(r["model"], r["session_key"], r["deployment"]) for r in rows] == [
        ("m", session.pin, "b/m")]


async def test_an_expired_pin_is_not_recalled(pg_pool: Any) -> None:
    """A pin past its cache TTL routes as if there were none."""
    router = Router()
    router.share(pg_pool)
    session = session_of("m", {"session-id": "s-2"}, {})
    assert session is not None
    async with pg_pool.connection() as conn:
        await conn.execute("INSERT INTO routing_pins VALUES ('m', %s, 'c/m', "
                           "now() - interval '1 second')", (session.pin,))
    await router.recall(MODEL, session)
    assert router.pinned(MODEL, session, router.clock()) is None
