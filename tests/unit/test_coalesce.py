"""The admission coalescer never strands a granted permit (pure asyncio, no database)."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.governance import Permit
from gateway.governance._coalesce import Coalescer


async def test_caller_cancelled_as_its_batch_resolves_gets_its_permit_refunded() -> None:
    """A caller cancelled in the loop turn its admission is answered has the permit refunded."""
    refunded: list[str] = []

    async def send(reqs):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return [Permit(id=f"p{i}", request=r) for i, r in enumerate(reqs)]

    async def refund(permit: Permit) -> None:
        refunded.append(permit.id)

    coalescer = Coalescer(send, refund, max_in_flight=1)
    caller: asyncio.Future[object] | None = None
    answer = coalescer._one_batch

    async def answer_then_cancel(batch):  # type: ignore[no-untyped-def]
        await answer(batch)  # sets the caller's result; its wake-up is only scheduled
        assert caller is not None
        caller.cancel()  # e.g. a client disconnect handled in the same loop turn

    coalescer._one_batch = answer_then_cancel  # type: ignore[method-assign]
    caller = asyncio.ensure_future(coalescer.admit(["req"]))  # type: ignore[list-item]
    with contextlib.suppress(asyncio.CancelledError):
        await caller
    for _ in range(5):
        await asyncio.sleep(0)
    assert caller.cancelled()
    assert refunded == ["p0"]
