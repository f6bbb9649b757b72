"""Provider credential sources: refreshed before expiry, a failure confined and explained;
the ``credentials`` config shapes; Bedrock's body, error and event-stream translation."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from botocore.eventstream import EventStreamBuffer

from gateway.config import AwsCredentials, Credentials, StaticCredentials
from gateway.providers import CredentialSource, CredentialsUnavailable, DispatchFailed, Fetched
from gateway.providers._bedrock import _events, anthropic_error, bedrock_body, error_type
from gateway.providers._credentials import AwsSource
from gateway.providers._eventstream import (
    chunk_bytes,
    chunk_message,
    exception_message,
    message_headers,
    sse_event,
)


class Ticking(CredentialSource[str]):
    """Issues token-1, token-2, … each valid ``life_s``; fails while ``broken``."""

    def __init__(self, life_s: float) -> None:
        super().__init__(provider="p1")
        self.life_s = life_s
        self.issued = 0
        self.broken = False

    async def fetch(self) -> Fetched[str]:
        if self.broken:
            raise PermissionError("AccessDenied: role trust refused")
        self.issued += 1
        return Fetched(f"token-{self.issued}", time.time() + self.life_s)


async def test_source_refreshes_before_expiry() -> None:
    """A credential is replaced before it expires: every read in between succeeds."""
    source = Ticking(life_s=3.0)
    await source.start()
    try:
        seen = set()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            seen.add(source.current())  # never raises: the next one came first
            await asyncio.sleep(0.05)
        assert len(seen) >= 3
    finally:
        await source.close()


async def test_failed_refresh_is_unavailable_once_expired(
        caplog: pytest.LogCaptureFixture) -> None:
    """A refresh failure is logged with its cause; once the credential lapses, reads
    raise CredentialsUnavailable (a NotDispatched: nothing sent, nothing charged)."""
    source = Ticking(life_s=2.0)
    await source.start()
    try:
        assert source.current() == "token-1"
        source.broken = True
        with caplog.at_level(logging.WARNING, logger="mayu.credentials"):
            await asyncio.sleep(3.0)
        with pytest.raises(CredentialsUnavailable) as err:
            source.current()
        assert err.value.dispatched is False
        assert "AccessDenied" in str(err.value)
        assert any("credential refresh failed for provider p1" in r.getMessage()
                   for r in caplog.records)
    finally:
        await source.close()


async def test_never_fetched_is_unavailable() -> None:
    """A source whose first fetch failed answers CredentialsUnavailable, not a hang."""
    source = Ticking(life_s=60)
    source.broken = True
    await source.start(wait_s=0.2)
    try:
        with pytest.raises(CredentialsUnavailable):
            source.current()
    finally:
        await source.close()


async def test_aws_source_static_keys_by_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Static AWS keys come from their references, and botocore freezes them."""
    monkeypatch.setenv("T_AK", "AKIDEXAMPLE")
    monkeypatch.setenv("T_SK", "secret-example")
    settings = AwsCredentials(region="us-east-1", access_key_id_ref="env:T_AK",
                              secret_access_key_ref="env:T_SK")
    got = await AwsSource(settings, provider="b", where="providers[0]").fetch()
    assert (got.value.access_key, got.value.secret_key, got.expires_at) == (
        "AKIDEXAMPLE", "secret-example", None)


async def test_aws_source_profile_and_default_chain(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A named profile of the shared credentials file, and botocore's default chain
    (here the environment), are what the source signs with."""
    shared = tmp_path / "credentials"
    shared.write_text("[bedrock]\naws_access_key_id = AKIDPROFILE\n"
                      "aws_secret_access_key = profile-secret\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(shared))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENVIRON")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environ-secret")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    named = await AwsSource(AwsCredentials(region="us-east-1", profile="bedrock"),
                            provider="b", where="providers[0]").fetch()
    assert named.value.access_key == "AKIDPROFILE"
    chain = await AwsSource(AwsCredentials(region="us-east-1"), provider="b",
                            where="providers[0]").fetch()
    assert (chain.value.access_key, chain.value.secret_key) == ("AKIDENVIRON",
                                                                "environ-secret")


def test_credentials_shape_names_the_bad_field() -> None:
    """The credentials union decodes by kind; a bad field fails with its path."""
    ok = msgspec.convert({"kind": "aws", "region": "eu-west-1", "role_arn": "arn:x",
                          "session_tags": {"team": "a"}}, Credentials)
    assert isinstance(ok, AwsCredentials) and ok.session_tags == {"team": "a"}
    assert isinstance(msgspec.convert({"kind": "static", "ref": "env:K"}, Credentials),
                      StaticCredentials)
    with pytest.raises(msgspec.ValidationError, match=r"duration_s"):
        msgspec.convert({"kind": "aws", "region": "x", "duration_s": 99_999}, Credentials)


def test_bedrock_body() -> None:
    """The Messages body loses model and stream, gains Bedrock's version and the betas."""
    body = msgspec.json.encode({"model": "us.anthropic.claude-x-v1:0", "stream": True,
                                "max_tokens": 5, "messages": []})
    model, stream, out = bedrock_body(body, {"anthropic-beta": "a-1, b-2"})
    doc = msgspec.json.decode(out)
    assert (model, stream) == ("us.anthropic.claude-x-v1:0", True)
    assert doc == {"max_tokens": 5, "messages": [], "anthropic_version": "bedrock-2023-05-31",
                   "anthropic_beta": ["a-1", "b-2"]}


def test_bedrock_errors_keep_retryability() -> None:
    """Throttling and ModelNotReady are 429s, validation a 400, refused credentials a
    definite 500 (not an ambiguous 502)."""
    assert error_type("ThrottlingException:http://internal.amazon.com/coral/") == \
        "ThrottlingException"
    assert error_type("modelNotReadyException") == "ModelNotReadyException"
    status, body = anthropic_error("ModelNotReadyException", "warming", 429)
    assert status == 429 and msgspec.json.decode(body)["error"]["type"] == "rate_limit_error"
    assert anthropic_error("ValidationException", "bad", 400)[0] == 400
    assert anthropic_error("ExpiredTokenException", "expired", 403)[0] == 500


def test_event_stream_round_trip() -> None:
    """Our framing decodes with botocore's decoder (CRCs checked) to the same event."""
    event = b'{"type":"message_stop"}'
    buffer = EventStreamBuffer()
    buffer.add_data(chunk_message(event) + exception_message("throttlingException", "slow"))
    first, second = list(buffer)
    assert chunk_bytes(first) == event
    assert msgspec.json.decode(first.payload)["bytes"] == base64.b64encode(event).decode()
    assert chunk_bytes(second) is None
    assert message_headers(second)[":exception-type"] == "throttlingException"


class _OneRead:
    """A response whose whole body arrives in one read."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.data


async def test_events_before_a_stream_exception_are_relayed_first() -> None:
    """An exception message in the same read as earlier events: those events reach the
    client (they are what a cut stream commits), then the stream fails as a cut."""
    start = b'{"type":"message_start","message":{"usage":{"input_tokens":3}}}'
    delta = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}'
    read = _OneRead(chunk_message(start) + chunk_message(delta)
                    + exception_message("modelStreamErrorException", "boom"))
    got: list[bytes] = []
    with pytest.raises(DispatchFailed, match="modelStreamErrorException: boom"):
        async for out in _events(read, "b"):  # type: ignore[arg-type]
            got.append(out)
    assert got == [sse_event(start) + sse_event(delta)]
