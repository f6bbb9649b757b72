"""Integer µUSD pricing: usage classes, per-model prices, exact cost and admission bounds."""

from gateway.pricing._price import (
    CLASSES,
    INPUT_CLASSES,
    InvalidUsage,
    ModelPrice,
    Usage,
    class_cost_micro_usd,
    cost_bound_micro_usd,
    cost_micro_usd,
    cost_range_micro_usd,
)

__all__ = [
    "CLASSES",
    "INPUT_CLASSES",
    "InvalidUsage",
    "ModelPrice",
    "Usage",
    "class_cost_micro_usd",
    "cost_bound_micro_usd",
    "cost_micro_usd",
    "cost_range_micro_usd",
]
