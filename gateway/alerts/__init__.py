"""Budget alerts at 80, 90 and 100 % of every money budget (ADR-050, DESIGN §8).

:class:`BudgetAlerts` is fed by the Governor's settlement hook and asks an
:class:`AlertStore` (the shared database, or the local SQLite file) which thresholds were
reached and which events this replica claims; it counts, audits and (with a webhook)
delivers each claimed event once across replicas.
"""

from gateway.alerts._alerts import BudgetAlerts, moved_budgets
from gateway.alerts._model import (
    THRESHOLDS,
    AlertEvent,
    Budget,
    CheckResult,
    thresholds_reached,
)
from gateway.alerts._stores import AlertStore, PostgresAlertStore, SqliteAlertStore
from gateway.alerts._webhook import Delivery, WebhookSender, signature

__all__ = [
    "THRESHOLDS",
    "AlertEvent",
    "AlertStore",
    "Budget",
    "BudgetAlerts",
    "CheckResult",
    "Delivery",
    "PostgresAlertStore",
    "SqliteAlertStore",
    "WebhookSender",
    "moved_budgets",
    "signature",
    "thresholds_reached",
]
