"""An error kind's fields given in its class line: what it states, and what it inherits."""

from __future__ import annotations

from gateway.errors import (
    AccountFrozen,
    BudgetExhausted,
    InferplaneError,
    PreconditionFailed,
    RevisionConflict,
    RuleUnsupported,
)


def test_class_line_sets_fields() -> None:
    """A field named in the class line is the kind's own, the same as a class attribute."""
    assert (BudgetExhausted.status, BudgetExhausted.openai_type, BudgetExhausted.anthropic_type,
            BudgetExhausted.code, BudgetExhausted.error_code, BudgetExhausted.should_retry) == (
        402, "insufficient_quota", "billing_error", "insufficient_quota", "budget_exhausted",
        False)
    assert vars(BudgetExhausted)["should_retry"] is False


def test_left_out_fields_are_the_parents() -> None:
    """A field the class line leaves out is the parent's; one it names overrides it."""
    assert (PreconditionFailed.status, PreconditionFailed.code) == (412, "revision_conflict")
    assert "code" not in vars(PreconditionFailed)
    assert PreconditionFailed.openai_type == RevisionConflict.openai_type
    assert (AccountFrozen.status, AccountFrozen.error_code) == (402, "account_frozen")
    assert (RuleUnsupported.anthropic_type, RuleUnsupported.should_retry) == ("api_error", False)


def test_kind_without_fields_is_the_base() -> None:
    """A kind that names no field answers as the base: 500, internal_error."""

    class Plain(InferplaneError):
        """Plain."""

    assert (Plain.status, Plain.code, Plain.error_code, Plain.should_retry) == (
        500, "internal_error", None, None)
    assert Plain().message == "Plain."
