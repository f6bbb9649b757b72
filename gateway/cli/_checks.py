"""The checks ``mayu serve`` runs before it starts, shared with ``mayu config check``.

One function, so ``config check`` says "config ok" exactly when ``serve`` would get past
its configuration: the file decodes with every range respected (``load_settings``), every
secret reference resolves, the admin tokens and the rotation secret are long enough and
no admin token is given twice, the policy source is allowed for the profile, and the policy
files validate as one set. Database reachability and schema are checked by ``serve``
(and by ``config check --database``), since they are not properties of the file.
"""

from __future__ import annotations

from gateway.config import Settings, check_secrets, resolve_admin_tokens


def preflight(settings: Settings) -> None:
    """Raise :class:`ConfigError` or :class:`PolicyInvalid` for what serve would refuse."""
    from gateway.app import check_policy_source
    from gateway.keys import rotation_secrets

    check_secrets(settings)
    resolve_admin_tokens(settings.server)  # long enough, no name or value twice
    rotation_secrets(settings)  # long enough
    check_policy_source(settings)
    if settings.policies:
        from gateway.policy import FilePolicySource

        FilePolicySource(settings.policies, poll_s=0).reload(strict=True)


def check_database(settings: Settings) -> str | None:
    """Shared profile: the database answers and is at this version's schema head.

    Returns a description of what was checked (None when the profile has no database).
    """
    if not settings.shared or settings.database is None:
        return None
    from gateway.config import resolve_secret
    from gateway.schema import check_dsn, code_heads, describe_dsn

    dsn = resolve_secret(settings.database.dsn_ref, key="database.dsn_ref")
    check_dsn(dsn, connect_timeout_s=settings.database.connect_timeout_s)
    return f"{describe_dsn(dsn)} at schema {', '.join(code_heads())}"
