"""The hot-team bench's spread load (tests/bench/hotteam.py): each worker of all the
processes owns its own rows, so spread workers never wait on each other's row locks.

An earlier version numbered workers ``w + 1000 * pid`` and took ``number % 100``: every
process's worker ``w`` landed on team ``w``, and "100 spread teams" were 8 contended ones.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.bench.hotteam import _owned


@given(workers=st.integers(1, 300), rows=st.integers(1, 300))
def test_workers_share_no_row_while_there_are_enough_rows(workers: int, rows: int) -> None:
    owned = [_owned(w, workers, rows) for w in range(workers)]
    assert all(owned), "every worker has a row"
    if workers <= rows:
        flat = [r for rs in owned for r in rs]
        assert sorted(flat) == list(range(rows)), "each row owned once, every row used"
    else:
        assert all(len(rs) == 1 for rs in owned)


def test_the_benchs_shapes() -> None:
    # 3 processes x 8 workers on 100 teams: 24 disjoint shares, none of them empty.
    shares = [set(_owned(w, 24, 100)) for w in range(24)]
    assert all(shares) and len(set().union(*shares)) == 100
    assert all(a.isdisjoint(b) for i, a in enumerate(shares) for b in shares[i + 1:])
    # The hot load: one team, every worker on it.
    assert {tuple(_owned(w, 72, 1)) for w in range(72)} == {(0,)}
