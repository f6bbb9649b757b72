"""Trace context through a bedrock deployment (issue 40): the gateway adds the attempt's
``traceparent`` to a SigV4-signed request, unsigned, and the signing peer
(``tests/e2e/_bedrock_peer.py``) still accepts it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
import yaml

from tests.e2e._otlp import OtlpReceiver, otlp_receiver
from tests.e2e._procs import (
    Proc,
    create_key,
    create_team,
    header_tap,
    start_gateway,
)
from tests.e2e.test_bedrock import ENV, config, start_peer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def traced_bedrock(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[tuple[str, str, Path, OtlpReceiver]]:
    """(gateway URL, key, the bytes the peer received, receiver): the bedrock peer behind
    a header tap, a gateway tracing to a receiver process."""
    workdir = tmp_path_factory.mktemp("otel-bedrock")
    peer, sts_url = start_peer(workdir)
    tap_file = workdir / "peer-bytes.txt"
    try:
        with header_tap(peer.port, tap_file) as tap_port, otlp_receiver(workdir) as receiver:
            tapped = Proc(popen=peer.popen, port=tap_port, log_path=peer.log_path)
            path = config(workdir, tapped, sts_url, peer)  # the anthropic kind is unused
            doc: dict[str, Any] = yaml.safe_load(path.read_text())
            doc["telemetry"] = {"endpoint": receiver.url, "batch_delay_s": 0.2}
            path.write_text(yaml.safe_dump(doc))
            create_team(path, "otel-bedrock", env=ENV)
            key = create_key(path, "otel-bedrock", env=ENV)
            gateway = start_gateway(path, env=ENV)
            try:
                yield gateway.url, key, tap_file, receiver
            finally:
                gateway.stop()
    finally:
        peer.stop()


def test_a_signed_bedrock_request_carries_the_trace(
        traced_bedrock: tuple[str, str, Path, OtlpReceiver]) -> None:
    """A streamed Messages request to a bedrock deployment succeeds with the client's
    trace continued; the peer got a traceparent of that trace naming the attempt span,
    whose provider is aws.bedrock."""
    url, key, tapped, receiver = traced_bedrock
    trace_id, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0,
                                 default_headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    with client.messages.stream(model="claude-bedrock", max_tokens=16,
                                messages=[{"role": "user", "content": "hello"}]) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens > 0

    def attempt(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in rows if s["trace_id"] == trace_id and s["kind"] == 3]
    span = attempt(receiver.wait(receiver.spans, lambda rows: bool(attempt(rows))))[0]
    assert span["attributes"]["gen_ai.provider.name"] == "aws.bedrock"
    assert span["attributes"]["gen_ai.response.finish_reasons"] == [final.stop_reason]
    sent = re.findall(rb"traceparent: 00-([0-9a-f]{32})-([0-9a-f]{16})-01",
                      tapped.read_bytes(), re.I)
    assert (trace_id.encode(), span["span_id"].encode()) in sent
