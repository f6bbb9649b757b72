"""A replica restarting after an operator resolved one of its permits (both profiles).

The journal is written by :class:`Journal` as a replica writes it before a crash; the
operator resolves the permit through :mod:`gateway.operations` (what ``mayu permits
resolve`` and the admin API call); the real :class:`Governor` start-up then replays the
journal against the real store.
"""

from __future__ import annotations

import logging

import pytest

from gateway.governance import Governor, Journal, OutcomeKind
from gateway.operations import resolve_permit
from tests.integration.test_cli_permits import Backend, admit
from tests.integration.test_cli_permits import backend as backend  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


async def test_a_permit_an_operator_resolved_is_dropped_from_the_replay_without_an_error(
        backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    """The replay's conflicting settlement is an expected, handled outcome: logged at
    INFO with the permit and the stored outcome, never at ERROR; the operator's stands."""
    b = backend
    permit = await admit(b, "resolved-while-down")
    path = b.cwd / "journal-r1.jsonl"
    journal = Journal(str(path))
    journal.open()
    journal.admitted(permit)
    await journal.dispatching(permit.id)
    await journal.close()
    await resolve_permit(b.gov, permit.id, OutcomeKind.CANCELLED, "r1 is gone")

    caplog.set_level(logging.INFO, logger="mayu")
    governor = Governor(b.gov, journal=Journal(str(path)))
    await governor.start()
    await governor.close()

    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    [line] = [r for r in caplog.records if permit.id in r.getMessage()]
    assert line.levelno == logging.INFO
    assert "dropped: the store already holds another" in line.getMessage()
    assert "cancelled" in line.getMessage()
    assert governor.backlog == 0
    info = await b.gov.permit_info(permit.id)
    assert (info.status, info.detail) == ("cancelled", "operator: r1 is gone")
