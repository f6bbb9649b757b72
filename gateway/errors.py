"""The project's one exception hierarchy and its mapping to HTTP status and error shape.

Every error a client can see is a subclass of :class:`InferplaneError`; its docstring is
the default message and ``status`` its HTTP status. The ingress renders it in the
calling protocol's own error shape (OpenAI or Anthropic) via :func:`openai_error_body`
and :func:`anthropic_error_body`; nothing else in the code base builds error bodies.
"""

from __future__ import annotations

from typing import Any, ClassVar


class InferplaneError(Exception):
    """Internal gateway error."""

    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    anthropic_type: ClassVar[str] = "api_error"
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str | None = None, *, retry_after: int | None = None,
                 param: str | None = None) -> None:
        self.message = message or (self.__doc__ or self.__class__.__name__).strip()
        self.retry_after = retry_after
        self.param = param
        self.extra_headers: dict[str, str] = {}
        """Protocol headers the answer carries (e.g. the remaining-limit headers)."""
        super().__init__(self.message)

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return dict(self.extra_headers)
        return {**self.extra_headers, "Retry-After": str(self.retry_after)}


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


class RateLimited(InferplaneError):
    """Rate or token limit exhausted."""

    status = 429
    openai_type = "rate_limit_error"
    anthropic_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class BudgetExhausted(InferplaneError):
    """Spending limit exhausted."""

    status = 402
    openai_type = "insufficient_quota"
    anthropic_type = "billing_error"
    code = "insufficient_quota"


class GovernanceUnavailable(InferplaneError):
    """Governance storage is unavailable; no request is admitted."""

    status = 503
    openai_type = "server_error"
    anthropic_type = "overloaded_error"
    code = "governance_unavailable"

    def __init__(self, message: str | None = None, *, retry_after: int | None = 1,
                 param: str | None = None) -> None:
        super().__init__(message, retry_after=retry_after, param=param)


class SnapshotMismatch(GovernanceUnavailable):
    """The key, team or policy changed while the request was admitted; retry."""

    code = "snapshot_mismatch"


class UpstreamUnavailable(InferplaneError):
    """The upstream provider could not be reached."""

    status = 502
    code = "upstream_unavailable"


def openai_error_body(err: InferplaneError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.openai_type,
                      "param": err.param, "code": err.code}}


def anthropic_error_body(err: InferplaneError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": err.anthropic_type, "message": err.message}}
