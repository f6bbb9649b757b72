"""People in the shared database: the user record an identity binds, the brokered key a
person's credentials in one team stand for, and revoking a person.

The queries are ``sql/identity_queries.sql``; each function takes the caller's
connection (the caller owns the transaction). inferplaned's token exchange and revoke
route and the gateway's admin API call the same functions.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.identity._verify import Identity

# gateway.db and gateway.keys (and the sql package) are imported in the functions below:
# gateway.config imports this package (its settings), and gateway.db imports
# gateway.config, so importing them here would make a circle.


class Refused(Exception):
    """A person the exchange does not serve: an OAuth ``error`` and its HTTP status."""

    def __init__(self, status: int, error: str, description: str) -> None:
        super().__init__(description)
        self.status, self.error, self.description = status, error, description


@dataclass(frozen=True)
class Revoked:
    user: str
    revoked_at: datetime
    keys_revoked: int


async def brokered_key_hash(conn: Any, identity: Identity, team: str) -> str:
    """The hash of the person's brokered key in ``team``: binding the person to a user
    record and making the key the first time (run it in one transaction)."""
    import sql
    from gateway.db import fetch_one
    from gateway.keys import hash_key

    q = sql.identity_queries
    who = {"issuer": identity.issuer, "subject": identity.subject}
    user = await fetch_one(conn, q["user_by_subject"], who)
    if user is None:
        email = identity.claims.get("email")
        user = await fetch_one(conn, q["bind_user"], {
            **who, "name": identity.user, "email": email if isinstance(email, str) else None})
        if user is None:
            raise Refused(403, "access_denied",
                          f"user {identity.user!r} belongs to another identity")
    if user["revoked_at"] is not None:
        raise Refused(403, "access_denied", f"user {user['name']!r} is revoked")
    row = await fetch_one(conn, q["team_by_name"], {"team": team})
    if row is None:
        raise Refused(400, "invalid_target", f"team {team!r} does not exist")
    params = {"team_id": row["id"], "user": user["name"]}
    key = await fetch_one(conn, q["brokered_key"], params)
    if key is None:
        # No secret of this key exists anywhere: only its hash, which credentials carry.
        key = await fetch_one(conn, q["insert_brokered_key"], {
            **params, "id": "key_" + uuid.uuid4().hex[:16],
            "key_hash": hash_key(secrets.token_urlsafe(32))})
        key = key or await fetch_one(conn, q["brokered_key"], params)  # a concurrent one
    assert key is not None
    return str(key["key_hash"])


async def revoke_person(conn: Any, name: str) -> Revoked | None:
    """Refuse the user's exchanges and revoke their brokered keys (None: no such user)."""
    import sql
    from gateway.db import fetch_one

    row = await fetch_one(conn, sql.identity_queries["revoke_user"], {"name": name})
    if row is None:
        return None
    return Revoked(user=row["name"], revoked_at=row["revoked_at"],
                   keys_revoked=int(row["keys_revoked"]))


async def reinstate_person(conn: Any, name: str) -> bool:
    """Let a revoked user exchange again (False: no such user)."""
    import sql
    from gateway.db import fetch_one

    return await fetch_one(conn, sql.identity_queries["reinstate_user"], {"name": name}) \
        is not None
