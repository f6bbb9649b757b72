"""What an operator does to a governance store: resolve permits, lift freezes.

One implementation for both doors: ``mayu permits resolve`` / ``mayu accounts
unfreeze`` (:mod:`gateway.cli._permits`) and the admin API's ``/admin/v1/permits`` and
``/admin/v1/frozen`` routes (:mod:`gateway.admin._operations`) call these functions, so
a resolution through either is the same settlement with the same refusals.
"""

from gateway.operations._service import (
    USAGE_KEYS,
    OperatorStore,
    permit_of,
    price_of,
    resolve_permit,
    settle_as_operator,
    settlement_at_cost,
    settlement_at_usage,
    unfreeze,
    usage_of,
)

__all__ = [
    "USAGE_KEYS",
    "OperatorStore",
    "permit_of",
    "price_of",
    "resolve_permit",
    "settle_as_operator",
    "settlement_at_cost",
    "settlement_at_usage",
    "unfreeze",
    "usage_of",
]
