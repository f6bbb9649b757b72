"""Calling an app's own stores from a test, on the app's event loop.

Litestar's test clients run the app (its lifespan, and so its Postgres pool) in a
blocking portal: another thread with its own event loop. A store call awaited on the
test's loop uses that pool across loops, which works while a connection is free and
hangs for good when it has to wait for one (seen: a full run stopped for 10 minutes in
a fixture). :func:`in_app` runs the call on the app's loop instead. :func:`app_on` builds
an app on a test's own stores.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import Components, create_app
from gateway.config import load_settings
from gateway.governance import LocalGovernanceStore
from gateway.keys import KeyStore
from gateway.policy import StaticPolicySource

T = TypeVar("T")


def in_app(client: AsyncTestClient[Any], fn: Callable[..., Awaitable[T]], /,
           *args: Any, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)`` on the event loop that runs ``client``'s app."""
    return client.blocking_portal.call(functools.partial(fn, *args, **kwargs))


@asynccontextmanager
async def app_on(tmp_path: Path, keys: KeyStore,
                 governance: LocalGovernanceStore) -> AsyncIterator[AsyncTestClient[Any]]:
    """A client of the real app built on these stores (``governance`` opened here and
    closed after; ``keys`` is the caller's), no policy, its data dir ``tmp_path``."""
    await governance.open()
    settings = replace(load_settings(None), data_dir=str(tmp_path))
    app = create_app(settings, components=Components(
        key_store=keys, governance=governance, policy=StaticPolicySource()))
    try:
        async with AsyncTestClient(app=app) as client:
            yield client
    finally:
        await governance.close()
