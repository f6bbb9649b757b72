"""Bedrock bench (a script, not a test): what a ``bedrock`` deployment costs the gateway
beside an ``anthropic`` one — SigV4 signing with botocore and the event-stream decoding
into SSE — in CPU per request and in c=1 overhead over the upstream called directly.

One ``mayu serve`` with two Messages deployments of the same mock model: ``anthropic``
at ``mayu mock-upstream``, ``bedrock`` at ``tests/e2e/_bedrock_peer.py`` (static keys).
Per round, for JSON and streamed answers, each deployment gets ``--requests``
sequential requests through the gateway (kept-alive) and as many straight to its
upstream (the Bedrock ones signed by the client with botocore, as an AWS SDK would);
targets alternate within a round. Printed as medians over ``--rounds``:

- CPU per request of the gateway process (``/proc/<pid>/stat``, user + system);
- p50 latency through the gateway, straight to the upstream, and the difference.

    .venv/bin/python tests/bench/bedrock_speed.py [--rounds 3] [--requests 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.speed import tree_cpu as cpu_s  # noqa: E402 (the server and its workers)
from tests.e2e._procs import (  # noqa: E402
    Proc,
    create_key,
    create_team,
    start_gateway,
    start_mock_upstream,
)
from tests.e2e.conftest import PRICE  # noqa: E402
from tests.e2e.test_bedrock import MOCK_ID, REGION, STATIC, start_peer  # noqa: E402

PROMPT = {"max_tokens": 16, "messages": [{"role": "user", "content": "say something short"}]}


def serve(work: Path, peer: Proc, upstream: Proc) -> tuple[Proc, str]:
    config = work / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(work / "data"), "demo": False,
        "providers": [
            {"name": "aws", "kind": "bedrock", "base_url": peer.url, "credentials": {
                "kind": "aws", "region": REGION, "access_key_id_ref": "env:BEDROCK_AK",
                "secret_access_key_ref": "env:BEDROCK_SK"}},
            {"name": "up", "kind": "anthropic", "base_url": upstream.url}],
        "models": [
            {"name": "bedrock", "price": PRICE, "max_input_tokens": 200_000,
             "deployments": [{"provider": "aws", "upstream_model": MOCK_ID}]},
            {"name": "anthropic", "price": PRICE, "max_input_tokens": 200_000,
             "deployments": [{"provider": "up", "upstream_model": "mock-claude"}]}]}))
    env = {"BEDROCK_AK": STATIC[0], "BEDROCK_SK": STATIC[1]}
    gateway = start_gateway(config, env=env)
    create_team(config, "bench")
    return gateway, create_key(config, "bench")


def direct(kind: str, stream: bool, peer: Proc, upstream: Proc
           ) -> tuple[str, bytes, dict[str, str]]:
    """(url, body, headers) of one request straight to the upstream."""
    if kind == "anthropic":
        body = httpx.Request("POST", "/", json={"model": "mock-claude", "stream": stream,
                                                **PROMPT}).read()
        return f"{upstream.url}/v1/messages", body, {"content-type": "application/json"}
    op = "invoke-with-response-stream" if stream else "invoke"
    url = f"{peer.url}/model/{MOCK_ID.replace(':', '%3A')}/{op}"
    body = httpx.Request("POST", "/", json={"anthropic_version": "bedrock-2023-05-31",
                                            **PROMPT}).read()
    return url, body, {"content-type": "application/json"}


def run(client: httpx.Client, n: int, request: tuple[str, bytes, dict[str, str]], *,
        sign: bool) -> list[float]:
    url, body, headers = request
    times = []
    for _ in range(n):
        started = time.perf_counter()
        if sign:  # a fresh signature per request, as an AWS SDK makes one
            signed = AWSRequest(method="POST", url=url, data=body, headers=headers)
            SigV4Auth(Credentials(*STATIC), "bedrock", REGION).add_auth(signed)
            headers = dict(signed.headers.items())
        answer = client.post(url, content=body, headers=headers)
        answer.read()
        assert answer.status_code == 200, answer.text[:300]
        times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bedrock-bench-"))
    peer, _ = start_peer(work)
    upstream = gateway = None
    cpu: dict[tuple[str, bool], list[float]] = {}
    p50: dict[tuple[str, bool, str], list[float]] = {}
    try:
        upstream = start_mock_upstream(work)
        gateway, key = serve(work, peer, upstream)
        with httpx.Client(timeout=60) as client:
            for _ in range(args.rounds):
                for stream in (False, True):
                    for kind in ("anthropic", "bedrock"):
                        body = httpx.Request("POST", "/", json={
                            "model": kind, "stream": stream, **PROMPT}).read()
                        via = (f"{gateway.url}/v1/messages", body,
                               {"x-api-key": key, "content-type": "application/json"})
                        before = cpu_s(gateway.popen.pid)
                        times = run(client, args.requests, via, sign=False)
                        used = cpu_s(gateway.popen.pid) - before
                        cpu.setdefault((kind, stream), []).append(used / args.requests)
                        p50.setdefault((kind, stream, "gateway"), []).append(
                            statistics.median(times))
                        times = run(client, args.requests,
                                    direct(kind, stream, peer, upstream),
                                    sign=kind == "bedrock")
                        p50.setdefault((kind, stream, "direct"), []).append(
                            statistics.median(times))
    finally:
        for proc in (gateway, upstream, peer):
            if proc is not None:
                proc.stop()
    print(f"{args.rounds} rounds x {args.requests} sequential requests (medians)")
    print(f"{'deployment':<10} {'answer':<6} {'CPU/req':>9} {'p50 via':>9} "
          f"{'p50 direct':>11} {'overhead':>9}")
    for stream in (False, True):
        for kind in ("anthropic", "bedrock"):
            through = statistics.median(p50[(kind, stream, "gateway")]) * 1000
            straight = statistics.median(p50[(kind, stream, "direct")]) * 1000
            print(f"{kind:<10} {'SSE' if stream else 'JSON':<6} "
                  f"{statistics.median(cpu[(kind, stream)]) * 1e6:>7.0f}µs "
                  f"{through:>7.2f}ms {straight:>9.2f}ms {through - straight:>7.2f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
