"""Helpers for the local-profile store tests (SQLite files in a temp dir): a settable
clock, a principal and its requests built in memory, and a store opened for one test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeVar

from gateway.governance import (
    AdmissionRequest,
    LocalGovernanceStore,
    Permit,
    Refusal,
    build_request,
)
from gateway.keys import KeyLimits, Principal, Team, TeamLimits
from gateway.policy import EMPTY_SNAPSHOT

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


class Clock:
    """A settable clock: tests move time explicitly, never sleep."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> None:
        self.now += timedelta(**kw)


class _Opens(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...


S = TypeVar("S", bound=_Opens)


@asynccontextmanager
async def opened(store: S) -> AsyncIterator[S]:
    """``store`` opened, and closed after the block."""
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def principal(team: TeamLimits, key: KeyLimits | None = None, *, user: str | None = "alice",
              key_id: str = "key_1") -> Principal:
    return Principal(key_id=key_id, key_prefix="sk-inf-abcdef", key_revision=1,
                     key_limits=key or KeyLimits(), allowed_models=None,
                     team=Team(id="team_1", name="one", limits=team), user=user)


def request(p: Principal, *, tokens: int = 100, usd: int = 1000, now: datetime = T0,
            request_id: str | None = None) -> AdmissionRequest:
    return build_request(p, EMPTY_SNAPSHOT, request_id=request_id or uuid.uuid4().hex,
                         model="mock-gpt", token_bound=tokens, usd_bound=usd, now=now)


async def admit_one(store: LocalGovernanceStore, req: AdmissionRequest) -> Permit | Refusal:
    [result] = await store.admit([req])
    return result
