"""``inferplaned``: the control plane's command line (console script).

``inferplaned serve --config FILE`` runs the HTTP API; ``inferplaned check-config
--config FILE`` resolves and checks the config without serving. With no token configured
at all the server is unauthenticated: it logs a loud ``UNAUTHENTICATED`` warning and
refuses to bind anything but a loopback address (ADR-034 §6). ``serve`` refuses, in one
line naming ``mayu migrate``, a database that is not at this version's schema head, and
runs under the gateway's server (:func:`gateway.server.serve`: header limits, a
graceful drain within ``shutdown_grace_s`` on SIGTERM, SIGHUP ignored).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from controlplane.settings import ControlPlaneConfig, is_loopback, load_config, resolve_tokens
from gateway.cli import run_command
from gateway.config import resolve_secret
from gateway.errors import ConfigError
from gateway.server import serve

log = logging.getLogger("inferplaned")

DESCRIPTION = """\
inferplane control plane: stores GovernancePolicy documents (inferplane.dev/v1alpha1)
in Postgres and publishes every accepted write as a numbered generation that shared-mode
gateways enforce without restart.

HTTP API (Authorization: Bearer <token>; writers publish and read, readers only read):
  PUT    /v1alpha1/policies/{name}   publish a document (JSON or YAML body)
  GET    /v1alpha1/policies/{name}   one published document
  DELETE /v1alpha1/policies/{name}   remove a document (a new generation)
  GET    /v1alpha1/policies          every published document
  GET    /v1alpha1/generation        namespace, generation, fingerprint
  GET    /v1alpha1/changes?since=N   who changed what, when
  POST   /v1alpha1/sync              lease-profile heartbeat (data plane tokens only)
  GET    /v1alpha1/dataplanes        connected lease-profile gateways and their leases
  GET    /metrics                    Prometheus: lease refusals, frame changes
  GET    /healthz, /readyz           liveness; readiness (database reachable)
  POST   /v1alpha1/token             RFC 8693: an OIDC token -> a gateway credential
                                     (no bearer; with identity configured)
  GET    /v1alpha1/jwks.json         the credentials' public keys (no bearer)
  POST   /v1alpha1/users/{name}/revoke, /reinstate   a person's credentials (writers)
  POST   /v1alpha1/teams/{team}/keys a key of a team (writers; its secret answered once),
                                     held by every lease plane of the team
  POST   /v1alpha1/keys/{id}/revoke  revoke it (every lease plane, next heartbeat)
  POST   /v1alpha1/credentials       a short-lived cloud session (STS) for a team the
                                     plane's data plane token serves (lease profile)
"""

CONFIG_HELP = """\
YAML config file. Keys (all optional):
  database.dsn_ref            env:NAME or file:PATH (default env:INFERPLANE_DATABASE_URL)
  database.pool_min_size / pool_max_size / pool_timeout_s / connect_timeout_s
  listen.host / listen.port   (default 127.0.0.1:8470)
  auth.writer_tokens_ref      map token name -> env:NAME | file:PATH
  auth.reader_tokens_ref      map token name -> env:NAME | file:PATH
  auth.dataplane_tokens_ref   map token name -> {token_ref: env:NAME | file:PATH,
                              planes: [plane ids, or prefixes ending in *]} (sync only,
                              as those plane ids; a bare reference: any id, warned)
  lease.frame_change_interval_s  a plane's fresh counters accepted at most this often
                              (default 300)
  lease.max_accounts_per_plane   ledger rows one plane may open in the open windows
                              (default 5000)
  max_body_bytes              largest accepted document (default 1048576)
  max_sync_bytes              largest accepted heartbeat (default 4194304)
  shutdown_grace_s            SIGTERM: time in-flight requests get to finish (default 30)
  identity.issuers            OIDC issuers whose tokens are exchanged: issuer, audience,
                              user_claim, groups_claim, team_aliases, algorithms,
                              leeway_s, jwks_min_refresh_s (docs/identity.md)
  identity.credentials        issuer, audience, lifetime_s (3600), algorithm (EdDSA),
                              signing_keys_ref: [env:NAME | file:PATH] (first signs)
  credentials.NAME.aws        a role brokered to lease planes: region, role_arn,
                              external_id, session_name, duration_s, session_tags,
                              sts_endpoint_url, and inferplaned's own AWS identity
                              (default chain, profile, access_key_id_ref /
                              secret_access_key_ref) (docs/bedrock.md, "Lease profile")
  credentials.NAME.teams      teams that may have it (default: any a token serves);
                              a token needs auth.dataplane_tokens_ref.N.teams to get any
Token names are recorded as the author of each change."""


def check_bind(config: ControlPlaneConfig, host: str) -> bool:
    """True when authenticated; raises if unauthenticated on a non-loopback host."""
    if resolve_tokens(config.auth).any:
        return True
    if not is_loopback(host):
        raise ConfigError(
            f"listen.host: {host} is not a loopback address and no token is configured "
            "(auth.writer_tokens_ref / auth.reader_tokens_ref); refusing to serve an "
            "unauthenticated control plane on the network")
    return False


def _serve(args: argparse.Namespace) -> int:
    from controlplane.app import create_app
    from gateway.config import ServerSettings
    from gateway.schema import check_dsn

    config = load_config(args.config)
    host = args.host or config.listen.host
    port = args.port or config.listen.port
    if not check_bind(config, host):
        log.warning("UNAUTHENTICATED: no inferplaned token is configured; anyone who can "
                    "reach %s:%d can publish policies. Bound to loopback only.", host, port)
    check_dsn(resolve_secret(config.database.dsn_ref, key="database.dsn_ref"),
              connect_timeout_s=config.database.connect_timeout_s)
    app = create_app(config)
    log.info("inferplaned listening on http://%s:%d", host, port)
    started = serve(app, ServerSettings(host=host, port=port,
                                        shutdown_grace_s=config.shutdown_grace_s),
                    log_level=args.log_level)
    return 0 if started else 1


def _check_config(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    authenticated = check_bind(config, config.listen.host)
    tokens = resolve_tokens(config.auth)
    if config.identity is not None:
        from controlplane.identity import Broker

        Broker(config.identity)  # resolves the signing secrets: a bad one names its key
    from controlplane.credentials import CredentialBroker

    CredentialBroker(config.credentials)  # a brokered role's references, likewise
    print(f"ok  {args.config}: listen {config.listen.host}:{config.listen.port}, "
          f"{len(tokens.writers)} writer, {len(tokens.readers)} reader and "
          f"{len(tokens.dataplanes)} data plane tokens"
          + ("" if authenticated else " (UNAUTHENTICATED, loopback only)"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferplaned", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser(
        "serve", help="run the control plane HTTP API",
        description="Run the control plane HTTP API.\n\n" + CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--config", metavar="FILE", default=None,
                       help="YAML config file (default: built-in loopback defaults)")
    serve.add_argument("--host", default=None, help="override listen.host")
    serve.add_argument("--port", type=int, default=None, help="override listen.port")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=_serve)
    check = sub.add_parser(
        "check-config", help="check a config file (resolves token references)",
        description="Load and check a config file without serving.\n\n" + CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("--config", metavar="FILE", required=True, help="YAML config file")
    check.set_defaults(func=_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "info").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_command("inferplaned", args)


if __name__ == "__main__":
    sys.exit(main())
