"""The numeric ceilings shared by config, catalog, pricing, keys, policy, governance and
lease: the largest amount, limit, rate and token count any of them accepts.

Each ceiling is defined here once and imported where it is enforced, so a value the
config, the key stores or the lease protocol accept is one the planner accepts too. This
module imports nothing from ``gateway``: every package can import it without a cycle.
"""

from __future__ import annotations

# -- Counter figures (governance planner, key stores, config, catalog, lease protocol) --

MAX_AMOUNT = 1 << 50
"""The largest µUSD or token figure one charge may carry, and the largest window limit
(a key's or team's daily/monthly tokens or µUSD), price (µUSD per million tokens) or
lease account figure. 2**50 µUSD is $1.1e9, far above any real request or budget, so a
larger value is a caller bug; keeping figures this far below 2**63 lets windows sum
them exactly in 64-bit integers (SQLite INTEGER, Postgres BIGINT)."""

MAX_BUCKET_CAPACITY = 1 << 36
"""The largest rpm/tpm bucket capacity. A bucket holds capacity * BUCKET_SCALE scaled
units (BUCKET_SCALE = 60_000_000 < 2**26) and 2**36 * 2**26 = 2**62 still fits a signed
64-bit integer."""

MAX_TOKENS_PER_CLASS = 1 << 40
"""The most tokens one usage class of one response may report. No real request comes
near 2**40 tokens: anything above is an upstream bug, refused before any counter moves."""

# -- GovernancePolicy documents (the CRD in helm/inferplane/crds repeats these maxima) --
# Chosen for 64-bit storage only: µUSD and scaled bucket balances are Postgres bigints.
# They are looser than the planner's ceilings above: a policy rate above
# MAX_BUCKET_CAPACITY or a budget above MAX_AMOUNT µUSD is accepted here, and the
# planner then refuses every request that charges it.

MAX_POLICY_MILLI_USD = (2**63 - 1) // 1000 // 4
"""A budget's ``limitMilliUSD`` (and lease ``grant``): a quarter of the int64 range once
converted to µUSD (* 1000), leaving room for sums."""

MAX_POLICY_PER_MINUTE = 100_000_000_000
"""A rate rule's ``rpm``/``tpm``: 1e11 * BUCKET_SCALE (6e7) = 6e18 scaled units stays
below 2**63."""

MAX_POLICY_TOKENS = 10**15
"""A token quota's ``day``/``month`` and a budget's ``fitFloorTokens``: a round figure
just below MAX_AMOUNT (2**50 is about 1.13e15)."""

MAX_POLICY_IN_FLIGHT = 1_000_000
"""A concurrency rule's ``maxInFlight``: far above what one subject could hold open."""
