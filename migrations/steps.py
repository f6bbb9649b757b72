"""Building blocks of the revisions in ``migrations/versions``.

Most revisions run one SQL text up and one down; :func:`sql_steps` gives them their
``upgrade`` and ``downgrade`` instead of each file writing the same two functions.
"""

from __future__ import annotations

from collections.abc import Callable

from alembic import op


def sql_steps(*, up: str, down: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """A revision's ``upgrade`` (runs ``up``) and ``downgrade`` (runs ``down``)."""

    def upgrade() -> None:
        op.execute(up)

    def downgrade() -> None:
        op.execute(down)

    return upgrade, downgrade
