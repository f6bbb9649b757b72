"""How an upstream error status settles: definite refusals refund, timeouts keep bounds."""

from __future__ import annotations

import pytest

from gateway.governance import OutcomeKind
from gateway.ingress._dispatch import _error_outcome
from gateway.pricing import Usage


@pytest.mark.parametrize("status", [408, 502, 504, 524])
def test_gateway_timeouts_after_dispatch_keep_the_bounds(status: int) -> None:
    """A proxy's give-up status may hide a request the provider ran: settled uncertain."""
    assert _error_outcome(status).kind is OutcomeKind.UNCERTAIN


@pytest.mark.parametrize("status", [400, 401, 404, 422, 429, 500, 503, 529])
def test_provider_refusals_settle_with_zero_usage(status: int) -> None:
    """A provider's own error answer generated nothing: one request, no tokens, no money."""
    outcome = _error_outcome(status)
    assert outcome.kind is OutcomeKind.COMPLETE and outcome.usage == Usage()
