"""The project's one exception hierarchy and its mapping to HTTP status and error shape.

Every error a client can see is a subclass of :class:`InferplaneError`; its docstring is
the default message and ``status`` its HTTP status. The ingress renders it in the
calling protocol's own error shape (OpenAI or Anthropic) via :func:`openai_error_body`
and :func:`anthropic_error_body`; nothing else in the code base builds error bodies.

Machine-readable fields: OpenAI's ``error.type`` and ``error.code``; Anthropic's
``error.type`` and, on a refusal, ``error.details.error_code`` (the SDK's
``APIStatusError.error_code``). ``should_retry`` becomes the ``x-should-retry`` header
both SDKs obey before their own status rules. The refusal kinds below are what
:func:`gateway.ingress._shortfall.refusal_error` maps each refusal code to
(``docs/admission.md`` has the table).

A 5xx raised from a lower exception (``raise … from exc``: a provider's transport error,
a database error) may carry that exception's text, with provider names and internals:
the client reads its kind's own sentence and the request id instead
(:func:`client_message`); the message goes to the log and the audit line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar


@dataclass(frozen=True)
class SpentWindow:
    """The day or month window a refusal found spent: the remaining-limit headers say
    what it has left and when it resets (``gateway.ingress._ratelimit.window_headers``)."""

    dimension: str
    """``tokens`` or ``usd`` (µUSD)."""
    limit: int
    remaining: int
    resets: datetime


class InferplaneError(Exception):
    """Internal gateway error."""

    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    anthropic_type: ClassVar[str] = "api_error"
    code: ClassVar[str] = "internal_error"
    """OpenAI's ``error.code`` (and the audit line's ``error``)."""
    error_code: ClassVar[str | None] = None
    """A refusal's own code (``gateway.governance``'s), Anthropic's
    ``details.error_code``; where ``code`` is one several refusals share
    (``insufficient_quota``), the only field that tells them apart. Other kinds have
    none (their Anthropic shape is exactly ``type`` and ``message``)."""
    should_retry: ClassVar[bool | None] = None
    """``x-should-retry`` (None: no header; the SDKs go by the status)."""

    def __init__(self, message: str | None = None, *, retry_after: int | None = None,
                 param: str | None = None) -> None:
        self.message = message or default_message(type(self))
        self.retry_after = retry_after
        self.param = param
        self.extra_headers: dict[str, str] = {}
        """Protocol headers the answer carries (e.g. the remaining-limit headers)."""
        self.window: SpentWindow | None = None
        """The spent window of a quota or budget refusal (its protocol's headers)."""
        super().__init__(self.message)

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.should_retry is not None:
            headers["x-should-retry"] = "true" if self.should_retry else "false"
        return headers

    @property
    def internal(self) -> bool:
        """The message may name internals (built from a lower exception's text)."""
        return self.status >= 500 and self.__cause__ is not None


def default_message(kind: type[InferplaneError]) -> str:
    return (kind.__doc__ or kind.__name__).strip()


class ConfigError(InferplaneError):
    """Invalid configuration."""

    code = "config_error"


class BadRequest(InferplaneError):
    """The request is malformed."""

    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "invalid_request"


class PayloadTooLarge(BadRequest):
    """The request body exceeds the configured size limit."""

    status = 413
    anthropic_type = "request_too_large"
    code = "payload_too_large"


class NestingTooDeep(BadRequest):
    """The request body nests arrays and objects too deeply."""

    code = "json_too_deep"


class Unauthenticated(InferplaneError):
    """Missing, unknown, revoked or expired API key."""

    status = 401
    openai_type = "invalid_request_error"
    anthropic_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(InferplaneError):
    """This key may not use that model."""

    status = 403
    openai_type = "invalid_request_error"
    anthropic_type = "permission_error"
    code = "model_not_allowed"


class UnknownModel(InferplaneError):
    """The model is not configured on this gateway."""

    status = 404
    openai_type = "invalid_request_error"
    anthropic_type = "not_found_error"
    code = "model_not_found"


class SettlementConflict(InferplaneError):
    """The permit was already settled with a different outcome."""

    status = 409
    code = "settlement_conflict"


class NotFound(InferplaneError):
    """No such team, key or permit."""

    status = 404
    openai_type = "invalid_request_error"
    anthropic_type = "not_found_error"
    code = "not_found"


class UnknownPermit(NotFound):
    """No such permit: it was never admitted by this governance store."""

    code = "unknown_permit"


class RevisionConflict(InferplaneError):
    """The record changed since it was read (revision mismatch); re-read and retry."""

    status = 409
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "revision_conflict"


class AlreadyExists(InferplaneError):
    """A team (or key) by that name already exists."""

    status = 409
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "already_exists"


class KeyRevoked(InferplaneError):
    """The key is revoked: it cannot be rotated (create a new key)."""

    status = 409
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "key_revoked"


class PreconditionFailed(RevisionConflict):
    """The record's revision is not the one If-Match named; re-read it and retry."""

    status = 412


class AccessDenied(InferplaneError):
    """This token may not do that."""

    status = 403
    openai_type = "invalid_request_error"
    anthropic_type = "permission_error"
    code = "permission_denied"


# -- refusals -------------------------------------------------------------------------
# Two kinds of refusal: one that clears within seconds (a bucket refills, a lease is
# renewed, a snapshot is re-read) says so (x-should-retry: true) with its precise
# Retry-After; one that cannot clear before its window resets or someone acts (a spent
# day/month budget or token quota, a frozen account, a rule this build cannot enforce)
# says x-should-retry: false and has no Retry-After at all, since SDKs sleep on whatever
# Retry-After says (hours, until midnight) before their retry; the reset is in the
# message and the headers.


class RateLimited(InferplaneError):
    """Rate or token limit exhausted."""

    status = 429
    openai_type = "rate_limit_error"
    anthropic_type = "rate_limit_error"
    code = "rate_limit_exceeded"
    error_code = "rate_limited"
    should_retry = True


class SpendRateLimited(RateLimited):
    """Spending rate limit (µUSD per minute) exhausted."""

    status = 402  # a money refusal (gateway.governance.status_for), cleared by refill


class ConcurrencyLimited(RateLimited):
    """Too many requests open at once; retry when one finishes."""

    code = "concurrency_limited"
    error_code = "concurrency_limited"


class TokenQuotaExhausted(RateLimited):
    """Token quota exhausted until its window resets."""

    # OpenAI answers a spent quota 429 insufficient_quota; its clients (Codex) stop on
    # that code instead of retrying.
    openai_type = "insufficient_quota"
    code = "insufficient_quota"
    error_code = "token_quota_exhausted"
    should_retry = False


class BudgetExhausted(InferplaneError):
    """Spending limit exhausted."""

    status = 402
    openai_type = "insufficient_quota"
    anthropic_type = "billing_error"
    code = "insufficient_quota"
    error_code = "budget_exhausted"
    should_retry = False


class AccountFrozen(BudgetExhausted):
    """The account is frozen after invalid usage was reported; an operator must resolve it."""

    error_code = "account_frozen"


class GovernanceUnavailable(InferplaneError):
    """Governance storage is unavailable; no request is admitted."""

    status = 503
    openai_type = "server_error"
    anthropic_type = "overloaded_error"
    code = "governance_unavailable"
    error_code = "governance_unavailable"
    should_retry = True

    def __init__(self, message: str | None = None, *, retry_after: int | None = 1,
                 param: str | None = None) -> None:
        super().__init__(message, retry_after=retry_after, param=param)


class SnapshotMismatch(GovernanceUnavailable):
    """The key, team or policy changed while the request was admitted; retry."""

    code = "snapshot_mismatch"
    error_code = "snapshot_mismatch"


class LeaseMissing(GovernanceUnavailable):
    """No budget lease from the control plane yet; retry shortly."""

    code = "lease_missing"
    error_code = "lease_missing"


class LeaseExhausted(GovernanceUnavailable):
    """This data plane's lease allowance is used up and a renewal is on its way; retry."""

    code = "lease_exhausted"
    error_code = "lease_exhausted"


class LeaseExpired(GovernanceUnavailable):
    """The budget lease expired: the control plane has not answered for a while."""

    code = "lease_expired"
    error_code = "lease_expired"


class RuleUnsupported(GovernanceUnavailable):
    """A FailClosed rule this data plane cannot enforce refuses the requests it covers."""

    anthropic_type = "api_error"  # not overload: it stays until the rule or build changes
    code = "rule_unsupported"
    error_code = "rule_unsupported"
    should_retry = False

    def __init__(self, message: str | None = None, *, retry_after: int | None = None,
                 param: str | None = None) -> None:
        super().__init__(message, retry_after=retry_after, param=param)


class UpstreamUnavailable(InferplaneError):
    """The upstream provider could not be reached."""

    status = 502
    code = "upstream_unavailable"


def client_message(err: InferplaneError, request_id: str | None = None) -> str:
    """What the client reads: the message, or for an :attr:`~InferplaneError.internal`
    one its kind's own sentence and the request id (the log and audit say the rest)."""
    if not err.internal:
        return err.message
    sentence = default_message(type(err)).rstrip(".")
    return f"{sentence} (request {request_id})." if request_id else f"{sentence}."


def openai_error_body(err: InferplaneError, *, request_id: str | None = None
                      ) -> dict[str, Any]:
    return {"error": {"message": client_message(err, request_id), "type": err.openai_type,
                      "param": err.param, "code": err.code}}


def anthropic_error_body(err: InferplaneError, *, request_id: str | None = None
                         ) -> dict[str, Any]:
    error: dict[str, Any] = {"type": err.anthropic_type,
                             "message": client_message(err, request_id)}
    if err.error_code is not None:
        error["details"] = {"error_code": err.error_code}
    return {"type": "error", "error": error}
