"""The chart gives each lease-profile node its own data-plane token (issue 25): one
DaemonSet per listed node, pinned to it, reading only its node's key of the token
Secret, and inferplaned binding each token to that node's plane id; without a node list
the lease profile does not render."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (test extra) renders the chart")

from controlplane.settings import load_config, resolve_tokens  # noqa: E402

CHART = Path(__file__).resolve().parents[2] / "helm" / "inferplane"
VALUES = {"profile": "lease", "lease": {"nodes": ["node-a", "node-b"],
                                        "tokenSecret": {"name": "tokens"}}}


def render(values: dict[str, object]) -> list[dict[str, object]]:
    chart = helm.Chart.load(CHART)
    chart.validate_schema(values)
    docs: list[dict[str, object]] = []
    for text in chart.render(values, name="rel", namespace="ns", is_install=True).values():
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def test_each_node_gets_its_own_pinned_gateway_and_token() -> None:
    """Each DaemonSet runs on its node only and reads only its node's key of the Secret;
    their selectors do not overlap."""
    daemonsets = {d["metadata"]["name"]: d for d in render(VALUES)
                  if d["kind"] == "DaemonSet"}
    assert set(daemonsets) == {"rel-inferplane-gateway-node-a", "rel-inferplane-gateway-node-b"}
    selectors = set()
    for node in ("node-a", "node-b"):
        spec = daemonsets[f"rel-inferplane-gateway-{node}"]["spec"]
        selectors.add(yaml.safe_dump(spec["selector"]))
        pod = spec["template"]["spec"]
        terms = pod["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                           "values": [node]}]}]
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["INFERPLANE_CONTROL_PLANE_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "tokens", "key": node}
    assert len(selectors) == 2


def test_inferplaned_binds_each_token_to_its_node(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """inferplaned's config loads with one token per node, each bound to that node's id,
    read from its own file of the Secret."""
    docs = render(VALUES)
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"
             and d["metadata"]["name"] == "rel-inferplane-inferplaned"]
    text = cm["data"]["inferplaned.yaml"]
    for node in ("node-a", "node-b"):
        (tmp_path / node).write_text(f"{node}-token-0123456789")
        text = text.replace(f"file:/etc/inferplaned/dataplane/{node}",
                            f"file:{tmp_path / node}")
    for name in ("writer", "reader"):
        (tmp_path / name).write_text(f"{name}-token-0123456789")
        text = text.replace(f"file:/etc/inferplaned/tokens/{name}", f"file:{tmp_path / name}")
    path = tmp_path / "inferplaned.yaml"
    path.write_text(text)
    tokens = resolve_tokens(load_config(path).auth)
    assert tokens.planes == {"node-a": ("node-a",), "node-b": ("node-b",)}
    assert tokens.unscoped == []
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["dataplane-token"]["secret"]["items"] == [
        {"key": "node-a", "path": "node-a"}, {"key": "node-b", "path": "node-b"}]


def test_the_lease_profile_needs_its_node_list() -> None:
    """Without lease.nodes the lease profile refuses to render (no shared token)."""
    with pytest.raises(helm.HelmError, match="lease.nodes"):
        render({"profile": "lease"})
