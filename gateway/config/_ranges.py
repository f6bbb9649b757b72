"""The range of every numeric setting, as msgspec constraints (errors name the key path).

A value outside its range is refused when the file is decoded (``server.port: Expected
`int` <= 65535``), never clamped or wrapped: a port of 83876 must not listen on 18340,
a pool of 0 must not hang every request, a NaN timeout must not mean "forever".

Money, token, rate and limit ranges use the ceilings of :mod:`gateway.ceilings`, the
ones the governance, pricing and key-store code enforce at run time, so a config this
module accepts is never refused request by request later.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gateway.ceilings import MAX_AMOUNT, MAX_BUCKET_CAPACITY, MAX_TOKENS_PER_CLASS

MAX_SECONDS = 86_400.0
"""No timeout, interval or grace period of this service is longer than a day; a larger
value is a typo (milliseconds for seconds), and it keeps every duration finite."""
MAX_BYTES = 1 << 30
"""Size limits: 1 GiB is far above any request or header this gateway should buffer."""

Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
PoolSize = Annotated[int, msgspec.Meta(ge=1, le=10_000)]
Connections = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
Bytes = Annotated[int, msgspec.Meta(ge=1, le=MAX_BYTES)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]
"""A finite, positive duration (NaN, inf, 0 and negatives are refused)."""
SecondsOrZero = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
"""A finite duration where 0 means "none" (NaN, inf and negatives are refused)."""
Millis = Annotated[int, msgspec.Meta(ge=0, le=int(MAX_SECONDS * 1000))]
Tokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS_PER_CLASS)]
TokensOrZero = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS_PER_CLASS)]
Rate = Annotated[int, msgspec.Meta(ge=1, le=MAX_BUCKET_CAPACITY)]
"""rpm / tpm: a zero-capacity bucket would mean "no cap" to the planner, so omit it."""
Limit = Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
Coalesce = Annotated[int, msgspec.Meta(ge=0, le=10_000)]
BatchSize = Annotated[int, msgspec.Meta(ge=1, le=10_000)]
FileCount = Annotated[int, msgspec.Meta(ge=1, le=1000)]
"""How many rotated files to keep (at least one: rotation must not throw lines away)."""
Retries = Annotated[int, msgspec.Meta(ge=0, le=100)]
CacheEntries = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
"""Entries of an in-memory cache (0: none kept)."""
Percent = Annotated[int, msgspec.Meta(ge=0, le=1000)]
Workers = Annotated[int, msgspec.Meta(ge=1, le=64)]
"""Server worker processes on one host (``server.workers``)."""
PRICE_FIELDS = ("input", "output", "cache_read", "cache_write_5m", "cache_write_1h")
"""Prices (µUSD per million tokens) are checked in ``_load`` against ``MAX_AMOUNT``:
``ModelPrice`` lives in ``gateway.pricing``, shared with the request path."""
