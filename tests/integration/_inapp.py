"""Calling an app's own stores from a test, on the app's event loop.

Litestar's test clients run the app (its lifespan, and so its Postgres pool) in a
blocking portal: another thread with its own event loop. A store call awaited on the
test's loop uses that pool across loops, which works while a connection is free and
hangs for good when it has to wait for one (seen: a full run stopped for 10 minutes in
a fixture). :func:`in_app` runs the call on the app's loop instead.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from litestar.testing import AsyncTestClient

T = TypeVar("T")


def in_app(client: AsyncTestClient[Any], fn: Callable[..., Awaitable[T]], /,
           *args: Any, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)`` on the event loop that runs ``client``'s app."""
    return client.blocking_portal.call(functools.partial(fn, *args, **kwargs))
