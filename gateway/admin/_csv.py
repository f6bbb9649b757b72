"""The request log as CSV, written as it is read (``GET /admin/v1/requests.csv``).

An export over a million permits must not hold them: the rows are read a page at a time
(``PAGE_ROWS``, newest first, each page one keyset read after the previous page's last
row, the way ``next_cursor`` pages the JSON list) and each page is written to the client
before the next is read, so the gateway holds one page whatever the export's size. The
first page is read before the answer starts, so a store failing at once is an error
status; one failing later cuts the stream short. An export stops after
``MAX_EXPORT_ROWS`` rows (the ``X-Export-Row-Cap`` header says so up front); narrow it
with ``since``/``until`` to read further back.

Every text cell is neutralised against spreadsheet formulas (OWASP's CSV injection rule):
one starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading
``'``, so ``=HYPERLINK(…)`` in a user name stays text. Numbers are written as numbers.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

import msgspec

from gateway.governance import LogFilter, PermitInfo

MAX_EXPORT_ROWS = 1_000_000
"""The most rows one export writes (newest first)."""
PAGE_ROWS = 1_000
"""Rows read (and held) at a time."""
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutral(value: Any) -> Any:
    """``value``, with a text cell that a spreadsheet would read as a formula made text."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


async def read_ahead(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """``chunks`` with its first chunk (the header and the first page) already read, so a
    store that fails at once is the error table's answer (503), not a 200 cut short."""
    first = await anext(chunks)

    async def replay() -> AsyncIterator[str]:
        yield first
        async for chunk in chunks:
            yield chunk
    return replay()


async def csv_export(read: Callable[[LogFilter, int], Awaitable[list[PermitInfo]]],
                     f: LogFilter, *, columns: Sequence[str],
                     cells: Callable[[PermitInfo], Iterable[Any]],
                     max_rows: int = MAX_EXPORT_ROWS,
                     page_rows: int = PAGE_ROWS) -> AsyncIterator[str]:
    """The header line, then each page of ``read`` as CSV text, at most ``max_rows``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    written, before = 0, f.before
    while written < max_rows:
        limit = min(page_rows, max_rows - written)
        page = await read(msgspec.structs.replace(f, before=before), limit)
        for p in page:
            writer.writerow([neutral(c) for c in cells(p)])
        written += len(page)
        yield out.getvalue()
        out.seek(0)
        out.truncate()
        if len(page) < limit:
            return
        before = (page[-1].created_at, page[-1].id)
    if out.tell():
        yield out.getvalue()
