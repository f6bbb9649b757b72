"""Short-lived provider credentials, refreshed before they expire, off the request path.

A :class:`CredentialSource` holds one provider's current credential. The request path
only reads it (:meth:`CredentialSource.current`: no I/O, no lock); a background task
fetches the next one ``margin`` before the current one expires (a third of its lifetime,
at most ``MAX_MARGIN_S``), so no request waits for STS or a token endpoint and no
request is signed with a credential about to lapse. A failed fetch is logged on
``mayu.credentials`` as ``credential refresh failed`` (the cause, never a secret; counted
as ``mayu_credential_refresh_failures_total{provider}``) and retried every
``RETRY_S`` while the current credential is still valid. Once it has expired (or was
never had), :meth:`~CredentialSource.current` raises :class:`CredentialsUnavailable`, a
:class:`~gateway.providers.NotDispatched`: nothing left the gateway. A provider answers
it as a 503 of its own (``unavailable_response``): nothing is charged, the next
deployment is tried, and the client of the last one gets the 503 saying the provider's
credentials are unavailable. Other providers never notice.

How a new source plugs in (``gateway/providers/_gcp.py``, say)::

    class GcpSource(CredentialSource[str]):
        def __init__(self, settings: GcpCredentials, *, provider: str) -> None:
            super().__init__(provider=provider)
            self._settings = settings

        async def fetch(self) -> Fetched[str]:
            # blocking client libraries run in a thread: asyncio.to_thread(...)
            token, expires_at = await asyncio.to_thread(self._refresh)
            return Fetched(token, expires_at)  # expires_at: epoch seconds, None = never

and the provider calls ``await source.start()`` in its ``start``, ``source.current()`` per
request and ``await source.close()`` in its ``close``. The config shape goes into
``gateway/config/_credentials.py``. :class:`AwsSource` (botocore's credential chain and
STS) is the AWS one; with ``broker`` set it asks inferplaned instead
(``POST /v1alpha1/credentials`` with the plane's data-plane token, ADR-031): the session
credentials it answers live in this object only (never written, never logged), and are
asked for again on the same schedule as STS's. inferplaned's own side
(:mod:`controlplane.credentials`) assumes the role with :func:`fetch_aws`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx
import msgspec

from gateway.config import AwsBroker, AwsCredentials, resolve_secret
from gateway.providers._base import NotDispatched, UpstreamResponse
from gateway.tasks import cancel_and_wait

if TYPE_CHECKING:
    # botocore (~8 MB, 50 ms to import) loads on the first AWS credential fetch, not at
    # startup: a gateway without a Bedrock deployment never imports it.
    import botocore.session
    from botocore.credentials import ReadOnlyCredentials

log = logging.getLogger("mayu.credentials")

T = TypeVar("T")

MAX_MARGIN_S = 300.0
"""Refresh at most this long before expiry (5 minutes, as botocore's advisory refresh)."""
RETRY_S = 5.0
"""Between attempts after a failed refresh."""
CHAIN_RECHECK_S = 60.0
"""How often credentials without an expiry of their own are read again (the default
chain refreshes its own; re-reading picks up a rotated profile or environment)."""


class CredentialsUnavailable(NotDispatched):
    """The provider's credentials could not be had (the cause is in the log)."""


def unavailable_response(exc: CredentialsUnavailable, *, provider: str) -> UpstreamResponse:
    """A 503 in Anthropic's error shape for a provider without credentials: the status a
    fallback is tried after, and a definite answer (nothing was sent, nothing charged)."""
    body = {"type": "error", "error": {
        "type": "overloaded_error",
        "message": f"provider {provider}: its cloud credentials are unavailable "
                   "(the gateway log says why); retry later"}}
    log.warning("provider %s answered 503 without sending: %s", provider, exc)
    return UpstreamResponse(status=503, content_type="application/json",
                            chunks=_once(msgspec.json.encode(body)),
                            headers={"retry-after": str(int(RETRY_S))})


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


@dataclass(frozen=True)
class Fetched(Generic[T]):
    """One fetched credential and when it expires (epoch seconds; None: never)."""

    value: T
    expires_at: float | None = None


class CredentialSource(ABC, Generic[T]):
    """One provider's credential, refreshed in the background (module docstring)."""

    def __init__(self, *, provider: str) -> None:
        self.provider = provider
        self._current: Fetched[T] | None = None
        self._cause = "not fetched yet"
        self._task: asyncio.Task[None] | None = None
        self._fetched = asyncio.Event()

    @abstractmethod
    async def fetch(self) -> Fetched[T]:
        """Get a fresh credential (may block on the network; never on the request path)."""

    async def start(self, *, wait_s: float = 5.0) -> None:
        """Start refreshing; wait up to ``wait_s`` for the first credential (a failure
        is logged and retried, and the provider answers 503 meanwhile)."""
        if self._task is None:
            self._task = asyncio.create_task(self._refresh_loop(),
                                             name=f"credentials:{self.provider}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._fetched.wait(), wait_s)

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def current(self) -> T:
        """The current credential; :class:`CredentialsUnavailable` once it has expired
        (or none was ever fetched)."""
        got = self._current
        if got is None or (got.expires_at is not None and got.expires_at <= time.time()):
            raise CredentialsUnavailable(
                f"{self.provider}: credentials unavailable ({self._cause})")
        return got.value

    def _next_in(self, got: Fetched[T]) -> float:
        if got.expires_at is None:
            return CHAIN_RECHECK_S
        left = got.expires_at - time.time()
        return max(1.0, left - min(MAX_MARGIN_S, left / 3))

    async def _refresh_loop(self) -> None:
        while True:
            try:
                got = await self.fetch()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The cause's type and text: botocore's and the clouds' errors name what
                # failed (an unknown profile, AccessDenied), never the secret.
                self._cause = f"{type(exc).__name__}: {exc}"
                log.warning("credential refresh failed for provider %s: %s", self.provider,
                            self._cause, extra={"provider": self.provider})
                await asyncio.sleep(RETRY_S)
                continue
            self._current, self._cause = got, "expired, refresh pending"
            self._fetched.set()
            await asyncio.sleep(self._next_in(got))


class BrokerRefused(Exception):
    """inferplaned did not hand out the credential (its status and message: no secret)."""


# inferplaned's answer to ``POST /v1alpha1/credentials`` (controlplane/credentials.py
# makes it, fetch_brokered reads it). No class docstring: it would become the
# description of the schema in inferplaned's OpenAPI document.
class CredentialAnswer(msgspec.Struct, frozen=True, kw_only=True):
    credential: str
    team: str
    session_name: str
    """The role session's name (``<session_name>-<team>@<plane>``): CloudTrail's caller."""
    access_key_id: str
    secret_access_key: str
    session_token: str
    expiration: str
    """ISO 8601 (UTC): the plane asks again before then."""

    def __repr__(self) -> str:  # never a secret in a traceback or a log line
        return f"CredentialAnswer(session_name={self.session_name!r})"


async def fetch_brokered(broker: AwsBroker, *, where: str
                         ) -> Fetched[ReadOnlyCredentials]:
    """One session from inferplaned (:class:`BrokerRefused` when it refuses)."""
    token = resolve_secret(broker.token_ref, key=f"{where}.credentials.broker.token_ref")
    body = {"credential": broker.credential, "team": broker.team,
            "dataplane_id": broker.dataplane_id}
    async with httpx.AsyncClient(timeout=broker.timeout_s) as client:
        answer = await client.post(f"{broker.url.rstrip('/')}/v1alpha1/credentials",
                                   json=body, headers={"Authorization": f"Bearer {token}"})
    if answer.status_code != 200:
        try:
            message = answer.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = answer.reason_phrase
        raise BrokerRefused(f"inferplaned answered {answer.status_code} for credential "
                            f"{broker.credential!r} of team {broker.team!r}: {message}")
    got = msgspec.json.decode(answer.content, type=CredentialAnswer)
    from botocore.credentials import ReadOnlyCredentials
    return Fetched(ReadOnlyCredentials(
        got.access_key_id, got.secret_access_key, got.session_token),
        datetime.fromisoformat(got.expiration).timestamp())


def fetch_aws(s: AwsCredentials, *, where: str
              ) -> Fetched[ReadOnlyCredentials]:
    """Credentials of ``s`` (not brokered): the chain, a profile or keys, then STS when a
    role is named. Blocking (botocore): run it in a thread."""
    import botocore.config
    from botocore.credentials import ReadOnlyCredentials
    session = _session(s, where=where)
    if s.role_arn is None:
        creds = session.get_credentials()
        if creds is None:
            raise LookupError("no AWS credentials found (environment, profile, "
                              "web identity, container or instance role)")
        return Fetched(creds.get_frozen_credentials())
    sts: Any = session.create_client(
        "sts", region_name=s.region,
        endpoint_url=s.sts_endpoint_url or f"https://sts.{s.region}.amazonaws.com",
        config=botocore.config.Config(
            # AssumeRoleWithWebIdentity is unsigned: the token is the proof.
            signature_version=(botocore.UNSIGNED if s.web_identity_token_file
                               else None),
            # botocore refuses a DurationSeconds below AWS's 900 before sending; a
            # shorter session (a test peer's) is left for the STS to judge.
            parameter_validation=s.duration_s >= 900))
    args: dict[str, object] = {"RoleArn": s.role_arn, "RoleSessionName": s.session_name,
                               "DurationSeconds": s.duration_s}
    if s.web_identity_token_file:
        with open(s.web_identity_token_file, encoding="utf-8") as f:
            args["WebIdentityToken"] = f.read().strip()
        answer = sts.assume_role_with_web_identity(**args)
    else:
        if s.external_id:
            args["ExternalId"] = s.external_id
        if s.session_tags:
            args["Tags"] = [{"Key": k, "Value": v} for k, v in s.session_tags.items()]
        answer = sts.assume_role(**args)
    c = answer["Credentials"]
    return Fetched(ReadOnlyCredentials(
        c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"]),
        c["Expiration"].timestamp())


def _session(s: AwsCredentials, *, where: str) -> botocore.session.Session:
    import botocore.session
    session = botocore.session.Session(profile=s.profile)
    if s.access_key_id_ref or s.secret_access_key_ref:
        if not (s.access_key_id_ref and s.secret_access_key_ref):
            raise ValueError(f"{where}.credentials: access_key_id_ref and "
                             "secret_access_key_ref go together")
        token = (resolve_secret(s.session_token_ref,
                                key=f"{where}.credentials.session_token_ref")
                 if s.session_token_ref else None)
        session.set_credentials(
            resolve_secret(s.access_key_id_ref,
                           key=f"{where}.credentials.access_key_id_ref"),
            resolve_secret(s.secret_access_key_ref,
                           key=f"{where}.credentials.secret_access_key_ref"),
            token)
    return session


class AwsSource(CredentialSource["ReadOnlyCredentials"]):
    """AWS credentials (``{kind: aws}``): botocore's chain or a profile, keys by
    reference, then STS ``AssumeRole`` / ``AssumeRoleWithWebIdentity`` when a role is
    named (botocore is synchronous: every fetch runs in a thread); or, with ``broker``,
    session credentials from inferplaned."""

    def __init__(self, settings: AwsCredentials, *, provider: str, where: str) -> None:
        super().__init__(provider=provider)
        self.settings = settings
        self._where = where

    async def fetch(self) -> Fetched[ReadOnlyCredentials]:
        if self.settings.broker is not None:
            return await fetch_brokered(self.settings.broker, where=self._where)
        return await asyncio.to_thread(fetch_aws, self.settings, where=self._where)
