"""The project's one exception hierarchy and its mapping to HTTP status and error shape.

Every error a client can see is a subclass of :class:`InferplaneError`; its docstring is
the default message and ``status`` its HTTP status, given with its other fields in the
class line (``class Gone(InferplaneError, status=410, code="gone"):``). The ingress
renders it in the calling protocol's own error shape (OpenAI or Anthropic) via
:func:`openai_error_body` and :func:`anthropic_error_body`; nothing else in the code base
builds error bodies.

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

    def __init_subclass__(cls, *, status: int | None = None, openai_type: str | None = None,
                          anthropic_type: str | None = None, code: str | None = None,
                          error_code: str | None = None, should_retry: bool | None = None,
                          **kwargs: Any) -> None:
        """A kind states its fields in its class line
        (``class Gone(InferplaneError, status=410, code="gone"):``); a field it leaves
        out (None) is its parent's."""
        super().__init_subclass__(**kwargs)
        fields = {"status": status, "openai_type": openai_type,
                  "anthropic_type": anthropic_type, "code": code,
                  "error_code": error_code, "should_retry": should_retry}
        for name, value in fields.items():
            if value is not None:
                setattr(cls, name, value)

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


class ConfigError(InferplaneError, code="config_error"):
    """Invalid configuration."""


class BadRequest(InferplaneError, status=400, openai_type="invalid_request_error",
                 anthropic_type="invalid_request_error", code="invalid_request"):
    """The request is malformed."""


class PayloadTooLarge(BadRequest, status=413, anthropic_type="request_too_large",
                      code="payload_too_large"):
    """The request body exceeds the configured size limit."""


class NestingTooDeep(BadRequest, code="json_too_deep"):
    """The request body nests arrays and objects too deeply."""


class Unauthenticated(InferplaneError, status=401, openai_type="invalid_request_error",
                      anthropic_type="authentication_error", code="invalid_api_key"):
    """Missing, unknown, revoked or expired API key."""


class Forbidden(InferplaneError, status=403, openai_type="invalid_request_error",
                anthropic_type="permission_error", code="model_not_allowed"):
    """This key may not use that model."""


class UnknownModel(InferplaneError, status=404, openai_type="invalid_request_error",
                   anthropic_type="not_found_error", code="model_not_found"):
    """The model is not configured on this gateway."""


class SettlementConflict(InferplaneError, status=409, code="settlement_conflict"):
    """The permit was already settled with a different outcome."""


class NotFound(InferplaneError, status=404, openai_type="invalid_request_error",
               anthropic_type="not_found_error", code="not_found"):
    """No such team, key or permit."""


class UnknownPermit(NotFound, code="unknown_permit"):
    """No such permit: it was never admitted by this governance store."""


class RevisionConflict(InferplaneError, status=409, openai_type="invalid_request_error",
                       anthropic_type="invalid_request_error", code="revision_conflict"):
    """The record changed since it was read (revision mismatch); re-read and retry."""


class AlreadyExists(InferplaneError, status=409, openai_type="invalid_request_error",
                    anthropic_type="invalid_request_error", code="already_exists"):
    """A team (or key) by that name already exists."""


class KeyRevoked(InferplaneError, status=409, openai_type="invalid_request_error",
                 anthropic_type="invalid_request_error", code="key_revoked"):
    """The key is revoked: it cannot be rotated (create a new key)."""


class PreconditionFailed(RevisionConflict, status=412):
    """The record's revision is not the one If-Match named; re-read it and retry."""


class AccessDenied(InferplaneError, status=403, openai_type="invalid_request_error",
                   anthropic_type="permission_error", code="permission_denied"):
    """This token may not do that."""


# -- refusals -------------------------------------------------------------------------
# Two kinds of refusal: one that clears within seconds (a bucket refills, a lease is
# renewed, a snapshot is re-read) says so (x-should-retry: true) with its precise
# Retry-After; one that cannot clear before its window resets or someone acts (a spent
# day/month budget or token quota, a frozen account, a rule this build cannot enforce)
# says x-should-retry: false and has no Retry-After at all, since SDKs sleep on whatever
# Retry-After says (hours, until midnight) before their retry; the reset is in the
# message and the headers.


class RateLimited(InferplaneError, status=429, openai_type="rate_limit_error",
                  anthropic_type="rate_limit_error", code="rate_limit_exceeded",
                  error_code="rate_limited", should_retry=True):
    """Rate or token limit exhausted."""


# 402: a money refusal (gateway.governance.status_for), cleared by refill
class SpendRateLimited(RateLimited, status=402):
    """Spending rate limit (µUSD per minute) exhausted."""


class ConcurrencyLimited(RateLimited, code="concurrency_limited",
                         error_code="concurrency_limited"):
    """Too many requests open at once; retry when one finishes."""


# OpenAI answers a spent quota 429 insufficient_quota; its clients (Codex) stop on
# that code instead of retrying.
class TokenQuotaExhausted(RateLimited, openai_type="insufficient_quota",
                          code="insufficient_quota", error_code="token_quota_exhausted",
                          should_retry=False):
    """Token quota exhausted until its window resets."""


class BudgetExhausted(InferplaneError, status=402, openai_type="insufficient_quota",
                      anthropic_type="billing_error", code="insufficient_quota",
                      error_code="budget_exhausted", should_retry=False):
    """Spending limit exhausted."""


class AccountFrozen(BudgetExhausted, error_code="account_frozen"):
    """The account is frozen after invalid usage was reported; an operator must resolve it."""


class GovernanceUnavailable(InferplaneError, status=503, openai_type="server_error",
                            anthropic_type="overloaded_error", code="governance_unavailable",
                            error_code="governance_unavailable", should_retry=True):
    """Governance storage is unavailable; no request is admitted."""

    def __init__(self, message: str | None = None, *, retry_after: int | None = 1,
                 param: str | None = None) -> None:
        super().__init__(message, retry_after=retry_after, param=param)


class SnapshotMismatch(GovernanceUnavailable, code="snapshot_mismatch",
                       error_code="snapshot_mismatch"):
    """The key, team or policy changed while the request was admitted; retry."""


class LeaseMissing(GovernanceUnavailable, code="lease_missing", error_code="lease_missing"):
    """No budget lease from the control plane yet; retry shortly."""


class LeaseExhausted(GovernanceUnavailable, code="lease_exhausted",
                     error_code="lease_exhausted"):
    """This data plane's lease allowance is used up and a renewal is on its way; retry."""


class LeaseExpired(GovernanceUnavailable, code="lease_expired", error_code="lease_expired"):
    """The budget lease expired: the control plane has not answered for a while."""


# Anthropic's api_error, not overload: it stays until the rule or build changes.
class RuleUnsupported(GovernanceUnavailable, anthropic_type="api_error",
                      code="rule_unsupported", error_code="rule_unsupported",
                      should_retry=False):
    """A FailClosed rule this data plane cannot enforce refuses the requests it covers."""

    def __init__(self, message: str | None = None, *, retry_after: int | None = None,
                 param: str | None = None) -> None:
        super().__init__(message, retry_after=retry_after, param=param)


class UpstreamUnavailable(InferplaneError, status=502, code="upstream_unavailable"):
    """The upstream provider could not be reached."""


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
