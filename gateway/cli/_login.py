"""``mayu login`` and ``mayu credential``: a person signs in at the company's IdP once,
then agents ask for short-lived gateway credentials (gateway.identity's agent side,
docs/identity.md).

``login`` runs the device authorization grant (it prints the page to open) and caches
the IdP's refresh token with a first credential (``--cache``, 0600). ``credential``
prints a credential valid for at least ``--min-valid`` seconds, refreshing it through
the IdP and inferplaned when needed: Claude Code's ``apiKeyHelper``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gateway.cli._commands import add_command
from gateway.identity import default_cache, login, mint_credential


def _login(args: argparse.Namespace) -> int:
    session = login(issuer=args.issuer, client_id=args.client_id, broker=args.broker,
                    team=args.team, scope=args.scope, cache=args.cache)
    print(f"Signed in as {session.user} (team {session.team}); the gateway credential "
          f"is valid until {session.expires_at} (Unix time). `mayu credential` prints a "
          f"fresh one.", file=sys.stderr)
    return 0


def _credential(args: argparse.Namespace) -> int:
    print(mint_credential(cache=args.cache, min_valid_s=args.min_valid))
    return 0


def _env_default(name: str) -> dict[str, Any]:
    value = os.environ.get(name)
    return {"default": value} if value else {"required": True}


def register(sub: Any) -> None:
    p = add_command(
        sub, "login", _login, summary="sign in at the IdP (device grant) for gateway credentials",
        description="Sign in at the company's OIDC provider with the device authorization "
                    "grant (open the printed page), exchange the ID token at inferplaned "
                    "for a gateway credential and cache the session (0600) for "
                    "`mayu credential`.")
    p.add_argument("--issuer", metavar="URL", **_env_default("MAYU_OIDC_ISSUER"),
                   help="the IdP's issuer URL (default $MAYU_OIDC_ISSUER)")
    p.add_argument("--client-id", metavar="ID", **_env_default("MAYU_OIDC_CLIENT_ID"),
                   help="the IdP's client id for mayu (default $MAYU_OIDC_CLIENT_ID)")
    p.add_argument("--broker", metavar="URL", **_env_default("MAYU_BROKER"),
                   help="inferplaned's URL, where credentials are exchanged "
                        "(default $MAYU_BROKER)")
    p.add_argument("--team", default=None,
                   help="the team the credentials are for (needed when you are in several)")
    p.add_argument("--scope", default="openid email groups offline_access",
                   help="the scopes asked of the IdP (default: %(default)s)")
    p.add_argument("--cache", type=Path, default=default_cache(),
                   help="the credentials cache (default $MAYU_CREDENTIALS or "
                        "~/.config/mayu/credentials.json)")
    c = add_command(
        sub, "credential", _credential,
        summary="print a fresh gateway credential (Claude Code apiKeyHelper)",
        description="Print a gateway credential valid for at least --min-valid seconds, "
                    "refreshed through the IdP and inferplaned when needed (after "
                    "`mayu login`).")
    c.add_argument("--cache", type=Path, default=default_cache(),
                   help="the credentials cache `mayu login` wrote")
    c.add_argument("--min-valid", type=float, default=300.0, metavar="SECONDS",
                   help="refresh when less than this is left (default: %(default)s)")
