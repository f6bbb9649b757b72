"""The ``providers[].credentials`` shapes: how a provider gets the secret it signs with.

One tagged union, decoded by msgspec on its ``kind`` field, so a bad document fails with
the path of the bad field (``providers[2].credentials.duration_s``):

- ``{kind: static, ref: env:NAME}``: one secret by reference, as ``api_key_ref``;
- ``{kind: aws, region: ..., ...}``: AWS credentials for SigV4 (``gateway.providers.
  _credentials.AwsSource``): the default chain (environment, shared files, web identity,
  container and instance roles, as botocore finds them), a named ``profile``, keys by
  reference, or ``web_identity_token_file``; then, with ``role_arn``, STS ``AssumeRole``
  (``AssumeRoleWithWebIdentity`` with a token file) with ``external_id``,
  ``session_name``, ``duration_s`` and ``session_tags``; or, with ``broker``, none of
  these: short-lived session credentials fetched from inferplaned (the lease profile,
  ADR-031: the plane holds no cloud secret, only its data-plane token).

A new cloud adds one Struct here (``tag="gcp"``, say) and one member to
:data:`Credentials`; its source lives in the providers package (the refresher base's
docstring says how it plugs in). Secrets are never inline: every ``*_ref`` field is an
``env:``/``file:`` reference, resolved at startup (:func:`credential_refs`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

DurationS = Annotated[int, msgspec.Meta(ge=15, le=43_200)]
"""STS session length. AWS accepts 900 to 43200 s (the role's maximum); shorter values
are for test peers (moto) that exercise expiry."""


class _Shape(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
             tag_field="kind"):
    pass


class StaticCredentials(_Shape, frozen=True, tag="static"):
    """One secret by reference (an API key)."""

    ref: str
    """``env:NAME`` or ``file:PATH``."""


class AwsBroker(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Session credentials brokered by inferplaned (``POST /v1alpha1/credentials``): the
    plane asks for one named credential for one team it serves and keeps the answer in
    memory only, asking again before it expires. Use TLS (``https://``) between plane and
    daemon anywhere but loopback: the answer carries a secret key and session token."""

    url: str
    """inferplaned's base URL (as ``control_plane.url``)."""
    token_ref: str
    """The plane's data-plane token (as ``control_plane.token_ref``); inferplaned hands
    out credentials only for the teams that token's ``teams`` names."""
    credential: str
    """The name of the credential in inferplaned's ``credentials`` section."""
    team: str
    """The team whose session this deployment signs with (CloudTrail names it)."""
    dataplane_id: str | None = None
    """This plane's id (as ``control_plane.dataplane_id``), checked against the token's
    ``planes`` and put into the session's name; unset: the token's name stands for it."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0


class AwsCredentials(_Shape, frozen=True, tag="aws"):
    """AWS credentials for SigV4, refreshed before they expire."""

    region: str
    """The region signed for and, unless ``base_url`` is set, the endpoint's region."""
    profile: str | None = None
    """A profile of the shared config/credentials files (unset: the default chain)."""
    access_key_id_ref: str | None = None
    """Static keys by reference (both or neither; ``session_token_ref`` optional)."""
    secret_access_key_ref: str | None = None
    session_token_ref: str | None = None
    web_identity_token_file: str | None = None
    """With ``role_arn``: ``AssumeRoleWithWebIdentity`` with this token (re-read on every
    refresh, as Kubernetes rotates it)."""
    role_arn: str | None = None
    """Assume this role with STS on top of the base credentials above."""
    external_id: str | None = None
    session_name: str = "inferplane"
    """The role session name: what CloudTrail shows as the caller."""
    duration_s: DurationS = 3600
    session_tags: dict[str, str] = {}
    """STS session tags (``team``, ``user``): attribute the calls in CloudTrail."""
    sts_endpoint_url: str | None = None
    """STS endpoint (unset: the regional ``https://sts.{region}.amazonaws.com``)."""
    broker: AwsBroker | None = None
    """Session credentials from inferplaned instead of any source above (alone: with a
    broker no other key but ``region`` may be set)."""

    def __post_init__(self) -> None:
        if self.broker is None:
            return
        local = [name for name in ("profile", "access_key_id_ref", "secret_access_key_ref",
                                   "session_token_ref", "web_identity_token_file",
                                   "role_arn", "external_id", "sts_endpoint_url")
                 if getattr(self, name) is not None]
        if self.session_tags:
            local.append("session_tags")
        if local:
            raise ValueError(f"broker: inferplaned is the only source of brokered "
                             f"credentials; remove {', '.join(local)}")


class GcpCredentials(_Shape, frozen=True, tag="gcp"):
    """Google OAuth2 access tokens (``gateway.providers._gcp``): a service-account key
    file, else application default credentials (workload identity, an external account)."""

    service_account_file: str | None = None
    """A service-account key JSON file (unset: application default credentials)."""
    scopes: list[str] = msgspec.field(
        default_factory=lambda: ["https://www.googleapis.com/auth/cloud-platform"])


class AzureCredentials(_Shape, frozen=True, tag="azure"):
    """Entra ID access tokens (``gateway.providers._entra``): client credentials with
    ``client_secret_ref``, else a managed identity (``client_id``: a user-assigned one)."""

    tenant_id: str | None = None
    client_id: str | None = None
    client_secret_ref: str | None = None
    authority_host: str | None = None
    """The Entra authority (unset: ``https://login.microsoftonline.com``)."""
    scope: str = "https://cognitiveservices.azure.com/.default"


Credentials = StaticCredentials | AwsCredentials | GcpCredentials | AzureCredentials
"""Every ``providers[].credentials`` shape, by ``kind``."""


def credential_refs(where: str, creds: Credentials | None) -> list[tuple[str, str]]:
    """The secret references of one provider's credentials, as (key path, reference)."""
    if isinstance(creds, StaticCredentials):
        return [(f"{where}.credentials.ref", creds.ref)]
    if isinstance(creds, AwsCredentials):
        refs = [(f"{where}.credentials.{name}", getattr(creds, name))
                for name in ("access_key_id_ref", "secret_access_key_ref",
                             "session_token_ref")]
        if creds.broker is not None:
            refs.append((f"{where}.credentials.broker.token_ref", creds.broker.token_ref))
        return [(key, ref) for key, ref in refs if ref is not None]
    if isinstance(creds, AzureCredentials) and creds.client_secret_ref is not None:
        return [(f"{where}.credentials.client_secret_ref", creds.client_secret_ref)]
    return []
