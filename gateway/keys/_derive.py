"""The key a rotation's secret is derived with, which the database never holds.

A rotation carrying an Idempotency-Key must answer a retry (on any replica) with the same
new secret, so that secret is derived, not drawn: HMAC-SHA256 keyed with a *rotation
secret* over the rotation's random salt and the Idempotency-Key. The salt and the new
secret's SHA-256 are stored with the rotation; the rotation secret is not, so a copy of
the database plus a guessed Idempotency-Key gives nothing.

Where the rotation secret comes from: ``server.rotation_secret_ref`` (one value for every
replica), with ``server.rotation_secret_previous_refs`` still accepted for replays after
the operator changes it; without it, a SQLite key store draws one into a file beside its
database (``<db>.rotation-key``, mode 0600: one host, one replica), and a Postgres key
store refuses Idempotency-Key rotations (several replicas must share the secret).
A replay tries each configured secret and answers the one whose result matches the
stored SHA-256, so it never answers a secret that does not work.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.errors import BadRequest, ConfigError

MIN_ROTATION_SECRET_CHARS = 32
"""A derivation key shorter than this is refused (it must not be guessable either)."""
_CONTEXT = b"inferplane key rotation v1\x00"


class RotationSecrets:
    """The current rotation secret (new rotations) and earlier ones (replays only)."""

    def __init__(self, current: bytes, *, previous: Sequence[bytes] = ()) -> None:
        self._current = current
        self._all = (current, *previous)

    def derive(self, salt: str, idempotency_key: str) -> bytes:
        """A new rotation's secret material (the caller makes a key of it)."""
        return _mac(self._current, salt, idempotency_key)

    def replay(self, salt: str, idempotency_key: str, *,
               matches: Callable[[bytes], bool]) -> bytes:
        """The material of an earlier rotation's secret: the first configured secret whose
        result ``matches`` (its SHA-256 is the stored one), else a 400 that says why."""
        for key in self._all:
            digest = _mac(key, salt, idempotency_key)
            if matches(digest):
                return digest
        raise BadRequest(
            "Idempotency-Key: the rotation made with this key was derived with a rotation "
            "secret this gateway no longer holds, so its secret cannot be shown again; "
            "rotate with a new Idempotency-Key", param="Idempotency-Key")


def _mac(key: bytes, salt: str, idempotency_key: str) -> bytes:
    return hmac.new(key, _CONTEXT + bytes.fromhex(salt) + idempotency_key.encode(),
                    hashlib.sha256).digest()


def checked_secret(value: str, *, key: str) -> bytes:
    """A configured rotation secret, refused (naming ``key``) if it is too short."""
    if len(value) < MIN_ROTATION_SECRET_CHARS:
        raise ConfigError(f"{key}: a rotation secret must be at least "
                          f"{MIN_ROTATION_SECRET_CHARS} characters (it has {len(value)})")
    return value.encode()


def local_rotation_secrets(db_path: str) -> RotationSecrets:
    """The SQLite store's own rotation secret, in ``<db>.rotation-key`` (drawn once,
    0600), when none is configured."""
    path = Path(db_path + ".rotation-key")
    if not path.exists():
        # Written whole under another name, then linked: a concurrent reader sees no
        # file or the whole secret, and of two writers the first link wins.
        draft = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return RotationSecrets(checked_secret(path.read_text().strip(), key=str(path)))


def no_rotation_secret() -> BadRequest:
    """Why a shared store without ``server.rotation_secret_ref`` refuses a replayable
    rotation."""
    return BadRequest("Idempotency-Key: rotating with an Idempotency-Key needs "
                      "server.rotation_secret_ref (the secret new keys are derived with, "
                      "which the database does not hold); set it on every replica, or "
                      "rotate without an Idempotency-Key", param="Idempotency-Key")

