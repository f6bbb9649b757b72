"""Cache affinity on real processes: three deployments — two Bedrock regions (the Bedrock
peer, SigV4 and the event-stream framing) and one Anthropic-shaped API, each its own
process with its own prompt cache — and twenty Claude-Code-shaped sessions at once
through the anthropic SDK: once with affinity, once round robin, in the same run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e._routing import AWS_KEY, Routed, start_routed
from tests.e2e._sessions import cache_share, run_sessions

DEPLOYMENTS = {"east": "bedrock:us-east-1", "west": "bedrock:us-west-2",
               "direct": "anthropic"}
SESSIONS, TURNS = 20, 10


def upstream_models(tag: str) -> dict[str, str]:
    """Each deployment's model id for one of the test's models (its own cache entries)."""
    return {p: f"us.anthropic.claude-mock-{tag}-v1:0" if kind.startswith("bedrock")
            else f"mock-claude-{tag}" for p, kind in DEPLOYMENTS.items()}


def routed_model(name: str, tag: str, routing: dict[str, object]) -> dict[str, object]:
    return {"name": name, "routing": routing,
            "deployments": [{"provider": p, "upstream_model": m}
                            for p, m in upstream_models(tag).items()]}


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    stack = start_routed(
        tmp_path_factory.mktemp("routing-affinity"), DEPLOYMENTS,
        [routed_model("claude-affine", "affine", {"strategy": "weighted", "affinity": True,
                                                  "on_affinity_conflict": "preferFallback"}),
         routed_model("claude-rr", "rr", {"strategy": "weighted"})])
    try:
        yield stack
    finally:
        stack.stop()


def test_affinity_bills_nine_in_ten_cacheable_tokens_as_reads_where_round_robin_does_not(
        routed: Routed) -> None:
    """With affinity ≥ 90 % of the cacheable input tokens are cache reads and every
    session costs less than under round robin (the baseline, same sessions, same run)."""
    key = routed.key("agents")
    affine = run_sessions(routed.gateway.url, key, "claude-affine",
                          sessions=SESSIONS, turns=TURNS)
    rr = run_sessions(routed.gateway.url, key, "claude-rr", sessions=SESSIONS, turns=TURNS)
    entries = [e for d in DEPLOYMENTS for e in routed.ledger(d)]
    share_a, read_a, write_a = cache_share(entries, upstream_models("affine").values())
    share_r, read_r, write_r = cache_share(entries, upstream_models("rr").values())
    print(f"\naffinity:    cache reads {share_a:.1%} of {read_a + write_a} cacheable tokens")
    print(f"round robin: cache reads {share_r:.1%} of {read_r + write_r} cacheable tokens")
    print("session  affinity µUSD  round-robin µUSD")
    for a, r in zip(affine, rr, strict=True):
        print(f"{a.session:7d}  {a.cost:13d}  {r.cost:16d}")
    print(f"  total  {sum(a.cost for a in affine):13d}  {sum(r.cost for r in rr):16d}")
    assert all(s == 200 for run in affine + rr for s in run.statuses)
    assert share_a >= 0.90, share_a
    assert share_r < share_a
    assert sum(a.cost for a in affine) < sum(r.cost for r in rr)
    per_deployment = {d: sum(e["model"] == m for e in routed.ledger(d))
                      for d, m in upstream_models("affine").items()}
    assert all(n >= TURNS for n in per_deployment.values()), per_deployment  # spread


def test_the_bedrock_secret_is_in_no_file_of_the_gateway(routed: Routed) -> None:
    """The AWS secret the Bedrock deployments sign with is in no config, log, audit line
    or data file the gateway wrote (it reads it from its environment)."""
    gateway_files = [p for p in routed.config.parent.rglob("*") if p.is_file()
                     and not p.name.startswith("bedrock-")]  # the peers' own logs
    assert any(p.name.startswith("gateway-") for p in gateway_files)
    for path in gateway_files:
        assert AWS_KEY[1].encode() not in path.read_bytes(), path
