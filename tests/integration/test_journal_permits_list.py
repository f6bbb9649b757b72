"""``mayu permits list`` shows the permits unreadable journal lines concern (issue 25).

Real ``mayu`` subprocesses on both profiles (the ``backend`` fixture of
``test_cli_permits``: a temp local data dir, and a migrated Postgres). The journal is
written by :class:`Journal` as a replica writes it, damaged as a machine crash or a bad
disk leaves it, then replayed by the real :class:`Governor` start-up against the real
store (which quarantines the bad lines into ``<journal>.rejected`` and compacts).
"""

from __future__ import annotations

import json

import pytest

from gateway.governance import Governor, Journal, Outcome, OutcomeKind
from gateway.pricing import Usage
from tests.integration.test_cli_permits import Backend, admit
from tests.integration.test_cli_permits import backend as backend  # noqa: F401 (fixture)
from tests.settling import settlement

pytestmark = pytest.mark.integration


async def test_permits_with_unreadable_journal_lines_stay_visible_with_the_reason(
        backend: Backend) -> None:
    """An intact permit is settled from the journal at start-up; one whose admit line
    is of the wrong shape stays pending, marked, with the quarantined line's number and
    reason; one whose outcome line is torn settles uncertain (never complete, never
    cancelled), marked, with the reason in its detail; a binary line naming no permit is
    listed on its own. Filtered out by --pending, a marked permit is still shown with its
    store status; --json carries the notes; the pending one resolves as usual."""
    b = backend
    intact, bad_admit, torn = (await admit(b, "intact"), await admit(b, "bad-admit"),
                               await admit(b, "torn-outcome"))
    # The local profile finds its journal from the config; the shared one is given it.
    if b.dsn is None:
        path, flags = b.cwd / ".mayu" / "journal-r9.jsonl", tuple[str, ...]()
        config = b.cwd / "local.yaml"
        config.write_text(config.read_text() + "server: {replica_id: r9}\n")
    else:
        path = b.cwd / "journal-r9.jsonl"
        flags = ("--journal", str(path))
    journal = Journal(str(path))
    journal.open()
    journal.admitted(intact)
    await journal.dispatching(intact.id)
    await journal.observed(intact.id, settlement(intact.request, Outcome(
        kind=OutcomeKind.COMPLETE, usage=Usage(input=40, output=2))))
    journal.admitted(torn)
    await journal.dispatching(torn.id)
    await journal.close()
    with path.open("ab") as f:
        f.write(b'{"t":"admit","p":"' + bad_admit.id.encode()
                + b'","r":{"request_id":5}}\n')                       # line 6
        f.write(b"\x00\xff\xfe binary \x80\n")                        # line 7
        f.write(b'{"t":"outcome","p":"' + torn.id.encode() + b'","s":{"kind":"comp')  # 8

    governor = Governor(b.gov, journal=Journal(str(path)))
    await governor.start()
    await governor.close()

    rejected = f"{path}.rejected"
    table = b.ok("permits", "list", *flags)
    rows = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    assert "complete" in table.split(intact.id)[1].splitlines()[0]
    assert f"{intact.id} *" not in table
    assert f"{bad_admit.id} *" in table and "pending" in rows[bad_admit.id]
    assert f"{torn.id} *" in table
    assert f"  {bad_admit.id}: {path} line 6 (kept in {rejected}, " in table
    assert "): admit record unreadable: wrong shape: Expected `str`, got `int`" in table
    assert (f"  {torn.id}: {path} line 8 (kept in {rejected}, " in table
            and "): outcome record unreadable: not JSON" in table)
    assert (f"  {torn.id}: settled uncertain: replica restarted: dispatched, outcome "
            "not observed; journal line 7 unreadable (not JSON") in table
    assert f"  no permit id recoverable: {path} line 7 (kept in {rejected}, " in table

    pending = b.ok("permits", "list", "--pending", *flags)
    assert f"{bad_admit.id} *" in pending and torn.id not in pending.split("\n\n")[0]
    assert f"  permit {torn.id} (uncertain): {path} line 8 " in pending

    done = b.mayu("permits", "list", "--pending", "--json", *flags)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    assert row["id"] == bad_admit.id and row["status"] == "pending"
    [note] = row["journal"]
    assert f"{path} line 6 (kept in {rejected}" in note and "wrong shape" in note
    assert f"permit {torn.id} (uncertain)" in done.stderr

    out = b.ok("permits", "resolve", bad_admit.id, "--as", "uncertain")
    assert f"resolved permit {bad_admit.id} as uncertain" in out
    after = b.ok("permits", "list", "--pending", *flags)
    assert after.startswith("no pending permits")
    assert f"  permit {bad_admit.id} (uncertain): {path} line 6 " in after


async def test_a_journal_no_gateway_reopened_is_read_as_it_is(backend: Backend) -> None:
    """Before any gateway restarted on it (nothing quarantined yet), permits list
    reads the unreadable lines from the journal itself, with their line numbers; a
    permit the store never granted is said to be unknown to it."""
    b = backend
    granted = await admit(b, "granted")
    path = b.cwd / "journal-crashed.jsonl"
    path.write_bytes(b'{"t":"admit","p":"' + granted.id.encode() + b'","r":[]}\n'
                     b'{"t":"dispatch","p":"not-a-permit-of-this-store"')
    table = b.ok("permits", "list", "--journal", str(path))
    assert f"  {granted.id}: {path} line 1: admit record unreadable: wrong shape" in table
    assert (f"  permit not-a-permit-of-this-store (not in this governance store): {path} "
            "line 2: dispatch record unreadable: not JSON") in table
    missing = b.mayu("permits", "list", "--journal", str(b.cwd / "nope.jsonl"))
    assert missing.returncode == 2 and "--journal: no such file" in missing.stderr
