"""``mayu permits resolve`` refuses bad figures and reads damaged journals (issue 25).

Real ``mayu`` subprocesses on both profiles (the ``backend`` fixture of
``test_cli_permits``: a temp local data dir, and a migrated Postgres). A refused figure
must leave the permit pending and every counter as it was: a settlement is for good.
"""

from __future__ import annotations

from pathlib import Path

from gateway.ceilings import MAX_AMOUNT, MAX_TOKENS_PER_CLASS
from tests.integration.test_cli_permits import Backend, admit, crashed_journal, usd_day
from tests.integration.test_cli_permits import backend as backend  # noqa: F401 (fixture)

KEYS = "input, output, cache_read, cache_write_5m, cache_write_1h, cache_write_unknown"


async def _still_pending(b: Backend, permit_id: str, window: str) -> None:
    pending = b.ok("permits", "list", "--pending")
    assert permit_id in pending
    assert await b.counter(window) == (1_000, 0, False)
    assert await b.liability(window) == 0


def _refused(b: Backend, *args: str) -> str:
    done = b.mayu("permits", "resolve", *args)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("mayu: error: ")
    return line


async def test_bad_usage_is_refused_before_anything_is_settled(backend: Backend) -> None:
    """--usage with an unknown key (a typo), a negative, non-integer or boolean value, a
    value above MAX_TOKENS_PER_CLASS, or no key at all exits 2 with one line naming the
    key and the allowed ones or range; the permit stays pending, nothing moves."""
    b = backend
    permit = await admit(b, "typo", usd=1_000, tokens=100)
    window = usd_day(permit)
    line = _refused(b, permit.id, "--usage", '{"inptu": 1200}')
    assert "--usage: unknown key 'inptu'" in line and f"(allowed: {KEYS})" in line
    for value in ("-1", "1.5", "true", '"12"', str(MAX_TOKENS_PER_CLASS + 1)):
        line = _refused(b, permit.id, "--usage", f'{{"input": 1, "output": {value}}}')
        assert f"--usage: output must be an integer in 0..{MAX_TOKENS_PER_CLASS}" in line
    for text in ("{}", "[1]", "{not json"):
        assert "--usage: " in _refused(b, permit.id, "--usage", text)
    await _still_pending(b, permit.id, window)
    # The same permit then settles normally with a well-formed figure.
    out = b.ok("permits", "resolve", permit.id, "--usage", '{"input": 500, "output": 100}')
    assert "as complete: committed 600 tokens, $0.001" in out


async def test_cost_and_tokens_above_the_ceiling_are_refused_without_traceback(
        backend: Backend) -> None:
    """--cost-micro-usd 10**20 (or any figure outside 0..MAX_AMOUNT, or not an integer),
    and --tokens likewise, exit 2 with one line naming the flag and the range; the permit
    stays pending."""
    b = backend
    permit = await admit(b, "huge", usd=1_000, tokens=100)
    window = usd_day(permit)
    for cost in (str(10**20), str(MAX_AMOUNT + 1), "-5", "12.5", "1e6"):
        line = _refused(b, permit.id, "--cost-micro-usd", cost)
        assert f"--cost-micro-usd: must be an integer in 0..{MAX_AMOUNT} (µUSD)" in line
    line = _refused(b, permit.id, "--cost-micro-usd", "10", "--tokens", str(10**20))
    assert f"--tokens: must be an integer in 0..{MAX_AMOUNT} (tokens)" in line
    await _still_pending(b, permit.id, window)
    out = b.ok("permits", "resolve", permit.id, "--cost-micro-usd", str(MAX_AMOUNT),
               "--tokens", "7")
    assert "as complete: committed 7 tokens" in out  # the ceiling itself is accepted


async def test_bulk_resolution_reports_unreadable_journal_lines(backend: Backend) -> None:
    """--journal with a wrong-shape line, a binary one and a torn one: each is reported
    on stderr once (file, line number, reason, not its content), no traceback, and the
    permits with readable lines still resolve from the journal: the one never dispatched
    as uncertain, not cancelled (the binary and torn lines name no permit, so either may
    have been its dispatch record)."""
    b = backend
    never, seen, damaged = (await admit(b, "never"), await admit(b, "seen"),
                            await admit(b, "damaged"))
    path = b.cwd / "journal-r1.jsonl"
    await crashed_journal(path, never, seen)
    secret = "sk-live-DO-NOT-LOG-55aa"
    with path.open("ab") as f:
        f.write(b'{"t":"admit","p":"' + damaged.id.encode() + b'","r":{"request_id":5,'
                b'"key_id":"' + secret.encode() + b'"}}\n')
        f.write(b"\x00\xff" + secret.encode() + b"\n")
        f.write(b'{"t":"dispatch","p":"' + secret.encode())
    for p in (never, seen, damaged):
        b.backdate(p.id, 90)

    done = b.mayu("permits", "resolve", "--all-older-than-minutes", "60",
                  "--journal", str(path))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and secret not in done.stderr + done.stdout
    warned = done.stderr.strip().splitlines()
    [shape] = [w for w in warned if "line 5 skipped" in w]
    assert (f"journal {path}" in shape and f"permit {damaged.id}" in shape
            and "wrong shape" in shape)
    assert sum("line 6 skipped (not JSON" in w for w in warned) == 1
    assert sum("line 7 skipped (not JSON" in w for w in warned) == 1
    assert f"journal {path}: 3 unreadable line(s) skipped" in done.stderr
    out = done.stdout
    assert f"resolved permit {never.id} as uncertain" in out
    assert f"resolved permit {seen.id} as complete: committed 42 tokens" in out
    assert f"resolved permit {damaged.id} as uncertain" in out
    assert Path(path).read_bytes().count(b"\n") == 6  # the CLI only reads the journal
