"""Key rotations on both key stores: what a database copy can give, and how many secrets work.

A rotation with an Idempotency-Key derives its secret with a rotation secret the database
does not hold, so the stored salt and the Idempotency-Key alone no longer recompute it,
while a retry (through another store on the same database, as another replica would)
answers the same secret, also after the operator changes the rotation secret. A key has
at most two working secrets: every rotation ends whatever earlier ones left in their grace.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.errors import BadRequest
from gateway.keys import KEY_PREFIX, PostgresKeyStore, SqliteKeyStore, TeamLimits, hash_key
from gateway.keys._derive import RotationSecrets

pytestmark = pytest.mark.integration

FIRST, SECOND = b"f" * 40, b"s" * 40
IDEM = "rotate-2026-12-04-ana"  # the guessable kind of key the docs used to show
Store = Callable[[RotationSecrets | None], Any]


@pytest.fixture(params=["sqlite", "postgres"])
async def stores(request: pytest.FixtureRequest,
                 tmp_path: Path) -> AsyncIterator[tuple[Store, Callable[[], list[Any]]]]:
    """A way to open more stores on one database (each a replica), and a reader of its
    key_rotations rows (what a copy of the database holds)."""
    opened: list[Any] = []
    if request.param == "sqlite":
        path = str(tmp_path / "mayu.db")

        async def make(secrets: RotationSecrets | None) -> Any:
            store = SqliteKeyStore(path, rotation_secrets=secrets)
            await store.open()
            opened.append(store)
            return store

        def rows() -> list[Any]:
            with sqlite3.connect(path) as conn:
                conn.row_factory = sqlite3.Row
                return [dict(r) for r in conn.execute("SELECT * FROM key_rotations")]
    else:
        from gateway.config import DatabaseSettings
        from gateway.db import open_pool

        dsn = request.getfixturevalue("pg_dsn")
        request.getfixturevalue("monkeypatch").setenv("INFERPLANE_DATABASE_URL", dsn)
        pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=4))
        await pool.open(wait=True)
        opened.append(pool)

        async def make(secrets: RotationSecrets | None) -> Any:
            return PostgresKeyStore(pool, rotation_secrets=secrets)

        def rows() -> list[Any]:
            with psycopg.connect(dsn, row_factory=psycopg.rows.dict_row) as conn:
                return conn.execute("SELECT * FROM key_rotations").fetchall()
    yield make, rows
    for store in opened:
        await store.close()


def _old_scheme(salt: str, idem: str) -> str:
    digest = hmac.new(bytes.fromhex(salt), idem.encode(), hashlib.sha256).digest()
    return KEY_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


async def test_a_database_copy_and_the_idempotency_key_do_not_give_the_secret(
        stores: tuple[Store, Callable[[], list[Any]]]) -> None:
    """The row's salt with the Idempotency-Key (HMAC(salt, key), the old derivation) gives
    no working secret; another replica with the same rotation secret answers the same
    secret; after the operator changes it (the old one kept as previous) a retry still
    answers it; a replica without the old one refuses the retry with a 400."""
    make, rows = stores
    a = await make(RotationSecrets(FIRST))
    await a.create_team(name="t", limits=TeamLimits())
    _, key = await a.create_key(team="t")
    first = await a.rotate_key(key.id, grace_s=60, idempotency_key=IDEM)
    (row,) = rows()
    assert row["new_key_hash"] == hash_key(first.secret)
    assert hash_key(_old_scheme(row["salt"], IDEM)) != row["new_key_hash"]
    assert first.secret not in repr(row)
    b = await make(RotationSecrets(FIRST))
    again = await b.rotate_key(key.id, grace_s=60, idempotency_key=IDEM)
    assert again.replayed and again.secret == first.secret
    changed = await make(RotationSecrets(SECOND, previous=[FIRST]))
    late = await changed.rotate_key(key.id, grace_s=60, idempotency_key=IDEM)
    assert late.replayed and late.secret == first.secret
    other = await make(RotationSecrets(SECOND))
    with pytest.raises(BadRequest, match="no longer holds") as refused:
        await other.rotate_key(key.id, grace_s=60, idempotency_key=IDEM)
    assert refused.value.param == "Idempotency-Key"
    fresh = await changed.rotate_key(key.id, grace_s=60, idempotency_key="another")
    assert (await other.rotate_key(key.id, grace_s=60, idempotency_key="another")).secret \
        == fresh.secret  # new rotations use the current secret only


async def test_a_grace_0_rotation_ends_every_earlier_secret(
        stores: tuple[Store, Callable[[], list[Any]]]) -> None:
    """Rotate with a day's grace, then with grace 0: the first secret (and the second) no
    longer authenticate; ten rotations with a day's grace leave exactly two working
    secrets, the current one and the last replaced."""
    make, _ = stores
    store = await make(RotationSecrets(FIRST))
    await store.create_team(name="t", limits=TeamLimits())
    first, key = await store.create_key(team="t")
    second = (await store.rotate_key(key.id, grace_s=86_400)).secret
    assert await store.resolve(hash_key(first)) is not None
    third = (await store.rotate_key(key.id, grace_s=0)).secret
    assert await store.resolve(hash_key(first)) is None
    assert await store.resolve(hash_key(second)) is None
    assert await store.resolve(hash_key(third)) is not None
    made = [third] + [(await store.rotate_key(key.id, grace_s=86_400)).secret
                      for _ in range(10)]
    working = [s for s in [first, second, *made]
               if await store.resolve(hash_key(s)) is not None]
    assert working == made[-2:]


async def test_the_shared_store_refuses_an_idempotency_key_without_a_rotation_secret(
        pg_pool: Any) -> None:
    """Without server.rotation_secret_ref a shared store refuses an Idempotency-Key
    rotation with a 400 naming the setting (and rotates without one as before)."""
    store = PostgresKeyStore(pg_pool)
    await store.create_team(name="t", limits=TeamLimits())
    _, key = await store.create_key(team="t")
    with pytest.raises(BadRequest, match="server.rotation_secret_ref"):
        await store.rotate_key(key.id, grace_s=0, idempotency_key="x" * 20)
    assert (await store.rotate_key(key.id, grace_s=0)).key.revision == 2


async def test_the_local_store_keeps_its_own_rotation_secret_beside_the_database(
        tmp_path: Path) -> None:
    """Unconfigured, a SQLite store draws its rotation secret once into <db>.rotation-key
    (mode 0600), and a second store on the file answers the same replay."""
    path = str(tmp_path / "mayu.db")
    a = SqliteKeyStore(path)
    await a.open()
    await a.create_team(name="t", limits=TeamLimits())
    _, key = await a.create_key(team="t")
    made = await a.rotate_key(key.id, grace_s=0, idempotency_key=IDEM)
    secret_file = Path(path + ".rotation-key")
    assert secret_file.stat().st_mode & 0o777 == 0o600
    b = SqliteKeyStore(path)
    await b.open()
    assert (await b.rotate_key(key.id, grace_s=0, idempotency_key=IDEM)).secret == made.secret
    await a.close()
    await b.close()
