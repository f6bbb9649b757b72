"""The Helm chart, rendered and linted by Helm's own engine (the helm-python-sdk wheel).

Each profile renders and lints: local x 1, shared x 1, shared x 3 and lease; local x 3
and schema violations (an unknown key, ``replicas: "three"``) are refused. The rendered
objects carry what a rollout needs: secrets from existing Secrets, soft anti-affinity by
default, a migration hook Job on the same image running ``mayu migrate``, preStop and a
termination grace derived from ``server.shutdown_grace_s``, probes on /healthz and
/readyz, a ``helm test`` pod, and monitoring objects only when asked for. The gateway
config the chart writes loads with the gateway's own ``load_settings``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (test extra) renders the chart")

from gateway.config import load_settings  # noqa: E402 (after the importorskip guard)

CHART = Path(__file__).resolve().parents[2] / "helm" / "inferplane"

PROFILES = {
    "local-1": {"profile": "local", "gateway": {"replicas": 1}},
    "shared-1": {"profile": "shared", "gateway": {"replicas": 1}},
    "shared-3": {"profile": "shared", "gateway": {"replicas": 3}},
    "lease": {"profile": "lease", "lease": {"nodes": ["node-a", "node-b"]}},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Schema-check and render as ``helm install`` would; every object, parsed."""
    chart = helm.Chart.load(CHART)
    chart.validate_schema(values)
    manifests = chart.render(values, name="rel", namespace="ns", is_install=True)
    docs: list[dict[str, Any]] = []
    for text in manifests.values():
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def kinds(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def gateway_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (workload,) = [d for d in docs if d["kind"] in ("StatefulSet", "DaemonSet")
                   and d["metadata"]["name"].endswith("-gateway")]
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def gateway_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"]
             == "rel-inferplane-gateway"]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["mayu.yaml"])
    return config


@pytest.mark.parametrize("name", list(PROFILES))
def test_each_profile_renders_and_lints(name: str) -> None:
    """local x 1, shared x 1, shared x 3 and lease render and pass helm lint --strict."""
    values = PROFILES[name]
    assert render(values)
    report = helm.lint(CHART, values, strict=True)
    assert report["errors"] == [], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report


def test_local_with_three_replicas_is_refused() -> None:
    """The local profile is exact for one replica only: replicas 3 fails to render."""
    with pytest.raises(helm.HelmError, match="requires profile: shared"):
        render({"profile": "local", "gateway": {"replicas": 3}})


@pytest.mark.parametrize("values", [
    {"gateway": {"replicas": "three"}},
    {"gateway": {"replicaz": 3}},
    {"gatway": {}},
    {"profile": "cloud"},
    {"gateway": {"port": 70000}},
    {"gateway": {"antiAffinity": "strict"}},
])
def test_schema_violations_are_refused(values: dict[str, Any]) -> None:
    """values.schema.json refuses unknown keys, wrong types and out-of-range values,
    in both the schema check and lint."""
    with pytest.raises(helm.HelmError):
        helm.Chart.load(CHART).validate_schema(values)
    assert helm.lint(CHART, values)["errors"] or any(
        m["severity"] == 3 for m in helm.lint(CHART, values)["messages"])


def test_inferplaned_only_where_a_profile_uses_it() -> None:
    """inferplaned renders for shared (policy publisher) and lease, never for local;
    the migration Job renders wherever there is a database."""
    for name, want in (("local-1", False), ("shared-3", True), ("lease", True)):
        found = kinds(render(PROFILES[name]))
        assert ("Deployment" in found) is want, name
        assert ("Job" in found) is want, name
    off = kinds(render({"controlplane": {"enabled": False}}))
    assert "Deployment" not in off and "Job" in off


def test_anti_affinity_is_soft_by_default_and_hard_on_request() -> None:
    """Soft by default (pods still schedule with fewer nodes than replicas); hard and
    none as options."""
    soft = gateway_pod(render(PROFILES["shared-3"]))["affinity"]["podAntiAffinity"]
    assert list(soft) == ["preferredDuringSchedulingIgnoredDuringExecution"]
    hard = gateway_pod(render({"gateway": {"antiAffinity": "hard"}}))
    assert list(hard["affinity"]["podAntiAffinity"]) == [
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert "affinity" not in gateway_pod(render({"gateway": {"antiAffinity": "none"}}))


def test_secrets_come_from_existing_secrets() -> None:
    """Database URL, admin and metrics tokens by secretKeyRef, provider keys by the
    env/envFrom given; the config references them as env: secret refs."""
    docs = render({"gateway": {
        "adminToken": {"existingSecret": "admin", "key": "t"},
        "metricsToken": {"existingSecret": "scrape", "key": "m"},
        "envFrom": [{"secretRef": {"name": "llm-keys"}}],
        "env": [{"name": "OPENAI_API_KEY",
                 "valueFrom": {"secretKeyRef": {"name": "llm", "key": "openai"}}}]}})
    (container,) = gateway_pod(docs)["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["INFERPLANE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "inferplane-database", "key": "url"}
    assert env["INFERPLANE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "admin"
    assert env["INFERPLANE_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "scrape"
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "llm"
    assert container["envFrom"] == [{"secretRef": {"name": "llm-keys"}}]
    server = gateway_config(docs)["server"]
    assert server["admin_token_ref"] == "env:INFERPLANE_ADMIN_TOKEN"
    assert server["metrics_token_ref"] == "env:INFERPLANE_METRICS_TOKEN"
    assert "value" not in env["INFERPLANE_DATABASE_URL"]


def test_named_admin_tokens_come_from_existing_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gateway.adminTokens``: each token by secretKeyRef, named with its access in the
    config the gateway loads (the admin API's and the console's write and read tiers)."""
    docs = render({"gateway": {"adminTokens": [
        {"name": "terraform", "access": "write", "existingSecret": "admin-tokens",
         "key": "tf"},
        {"name": "portal", "access": "read", "existingSecret": "admin-tokens",
         "key": "portal"}]}})
    (container,) = gateway_pod(docs)["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["INFERPLANE_ADMIN_TOKEN_0"]["valueFrom"]["secretKeyRef"] == {
        "name": "admin-tokens", "key": "tf"}
    assert env["INFERPLANE_ADMIN_TOKEN_1"]["valueFrom"]["secretKeyRef"] == {
        "name": "admin-tokens", "key": "portal"}
    server = gateway_config(docs)["server"]
    assert server["admin_tokens"] == [
        {"name": "terraform", "access": "write", "token_ref": "env:INFERPLANE_ADMIN_TOKEN_0"},
        {"name": "portal", "access": "read", "token_ref": "env:INFERPLANE_ADMIN_TOKEN_1"}]
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump(gateway_config(docs)))
    monkeypatch.setenv("INFERPLANE_ADMIN_TOKEN_0", "t" * 32)
    monkeypatch.setenv("INFERPLANE_ADMIN_TOKEN_1", "p" * 32)
    tokens = load_settings(path).server.admin_tokens
    assert [(t.name, t.access) for t in tokens] == [("terraform", "write"), ("portal", "read")]
    assert "admin_tokens" not in gateway_config(render({}))["server"]
    with pytest.raises(helm.HelmError):
        render({"gateway": {"adminTokens": [{"name": "x", "access": "admin",
                                             "existingSecret": "s", "key": "k"}]}})


def test_migration_job_is_a_hook_on_the_same_image() -> None:
    """A pre-install/pre-upgrade hook Job runs `mayu migrate` with the gateways' image
    and the database URL from the Secret."""
    found = kinds(render(PROFILES["shared-3"]))
    (job,) = found["Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (gateway,) = found["StatefulSet"][0]["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["mayu", "migrate"]
    assert container["image"] == gateway["image"]
    assert container["env"][-1]["name"] == "INFERPLANE_DATABASE_URL"


def test_drain_timing_follows_shutdown_grace() -> None:
    """server.shutdown_grace_s is gateway.shutdownGraceSeconds; the pod's grace covers
    preStop + drain + 15 s of shutdown; the config may not set the grace itself."""
    docs = render({"gateway": {"shutdownGraceSeconds": 45, "preStopSeconds": 7}})
    pod = gateway_pod(docs)
    assert gateway_config(docs)["server"]["shutdown_grace_s"] == 45
    assert pod["terminationGracePeriodSeconds"] == 7 + 45 + 15
    (container,) = pod["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "7"]
    with pytest.raises(helm.HelmError, match="shutdownGraceSeconds"):
        render({"gateway": {"config": {"server": {"shutdown_grace_s": 5}}}})


def test_worker_processes_pass_through_except_in_the_lease_profile(tmp_path: Path) -> None:
    """gateway.config.server.workers reaches the mayu config (which loads) in the local
    and shared profiles; the lease profile, one process per node, refuses it at render."""
    for profile in ("local-1", "shared-3"):
        values = {**PROFILES[profile], "gateway": {
            **PROFILES[profile].get("gateway", {}), "config": {"server": {"workers": 2}}}}
        path = tmp_path / f"{profile}.yaml"
        path.write_text(yaml.safe_dump(gateway_config(render(values))))
        assert load_settings(path).server.workers == 2
    with pytest.raises(helm.HelmError, match="server.workers > 1 requires profile"):
        render({**PROFILES["lease"], "gateway": {"config": {"server": {"workers": 2}}}})


def test_probes_and_security() -> None:
    """Liveness on /healthz, readiness on /readyz; non-root, read-only root, and the
    data dir and /tmp as the only writable mounts."""
    pod = gateway_pod(render(PROFILES["shared-3"]))
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/mayu", "/tmp"}


def test_lease_profile_runs_node_local_gateways() -> None:
    """Lease: one DaemonSet per listed node whose config names inferplaned's Service, a
    token ref (the node's own token from its Secret) and the node's name as the plane id,
    and local stores (no database env in the config); tests/unit/test_lease_trust_chart.py
    pins the per-node tokens."""
    docs = render(PROFILES["lease"])
    found = kinds(docs)
    assert len(found["DaemonSet"]) == 2 and "StatefulSet" not in found
    config = gateway_config(docs)
    assert config["control_plane"] == {"url": "http://rel-inferplane-inferplaned:8470",
                                       "token_ref": "env:INFERPLANE_CONTROL_PLANE_TOKEN",
                                       "dataplane_id": "env:INFERPLANE_NODE_NAME"}
    assert "key_store" not in config and "database" not in config
    for daemonset in found["DaemonSet"]:
        (container,) = daemonset["spec"]["template"]["spec"]["containers"]
        env = {e["name"] for e in container["env"]}
        assert {"INFERPLANE_CONTROL_PLANE_TOKEN", "INFERPLANE_NODE_NAME"} <= env
    (cp,) = [d for d in docs if d["kind"] == "ConfigMap"
             and d["metadata"]["name"].endswith("-inferplaned")]
    auth = yaml.safe_load(cp["data"]["inferplaned.yaml"])["auth"]
    assert set(auth["dataplane_tokens_ref"]) == {"node-a", "node-b"}


def test_helm_test_pod_checks_readiness() -> None:
    """A helm test hook pod probes the gateway's and inferplaned's /readyz."""
    (pod,) = kinds(render(PROFILES["shared-3"]))["Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert "rel-inferplane-gateway:4000/readyz" in script
    assert "rel-inferplane-inferplaned:8470/readyz" in script


def test_monitoring_objects_only_when_enabled() -> None:
    """PrometheusRule (80/90/100% budget alerts) and the Grafana dashboard ConfigMap
    appear only when enabled, and use only metrics the gateway exports."""
    assert "PrometheusRule" not in kinds(render({}))
    found = kinds(render({"monitoring": {"prometheusRule": {"enabled": True},
                                         "grafanaDashboard": {"enabled": True}}}))
    (rule,) = found["PrometheusRule"]
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    # Shared (the default): every money budget from the cluster gauges, max over replicas.
    assert {"InferplaneBudget80", "InferplaneBudget90", "InferplaneBudget100"} <= set(alerts)
    assert "mayu_cluster_budget_utilisation_ratio" in alerts["InferplaneBudget90"]["expr"]
    assert alerts["InferplaneBudget90"]["expr"].startswith("max by (scope, id, team, window)")
    (local,) = kinds(render({"profile": "local", "gateway": {"replicas": 1},
                             "monitoring": {"prometheusRule": {"enabled": True}}}))[
        "PrometheusRule"]
    local_alerts = {r["alert"]: r for g in local["spec"]["groups"] for r in g["rules"]}
    assert {"InferplaneTeamBudget80", "InferplaneTeamBudget90",
            "InferplaneTeamBudget100"} <= set(local_alerts)
    assert "InferplaneBudget80" not in local_alerts
    (board,) = [c for c in found["ConfigMap"] if c["metadata"]["name"].endswith("dashboard")]
    dashboard = json.loads(board["data"]["inferplane.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [r["expr"] for r in [*alerts.values(), *local_alerts.values()]]
    from gateway.metrics import Metrics
    exported = {m.name for m in Metrics().registry.collect()}
    for expr in exprs:
        for name in re.findall(r"\bmayu_[a-z_]+", expr):
            base = name.removesuffix("_total").removesuffix("_bucket")
            assert base in exported, (name, expr)


@pytest.mark.parametrize("name", ["local-1", "shared-3", "lease"])
def test_rendered_gateway_config_loads(tmp_path: Path, name: str) -> None:
    """The mayu.yaml the chart writes passes the gateway's own loader and checks."""
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump(gateway_config(render(PROFILES[name]))))
    settings = load_settings(path)
    assert settings.server.shutdown_grace_s == 30
    assert settings.shared is name.startswith("shared")
    assert (settings.control_plane is not None) is (name == "lease")


def test_rendered_inferplaned_config_loads(tmp_path: Path) -> None:
    """inferplaned's config from the chart passes inferplaned's own loader."""
    from controlplane.settings import load_config

    for name in ("shared-3", "lease"):
        (cp,) = [d for d in render(PROFILES[name]) if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"].endswith("-inferplaned")]
        path = tmp_path / f"{name}.yaml"
        path.write_text(cp["data"]["inferplaned.yaml"])
        assert load_config(path).shutdown_grace_s == 30


def _pods(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every pod spec the chart renders: workloads' templates, Jobs' and bare Pods."""
    pods = []
    for d in docs:
        if d["kind"] in ("StatefulSet", "DaemonSet", "Deployment", "Job"):
            pods.append((f"{d['kind']}/{d['metadata']['name']}",
                         d["spec"]["template"]["spec"]))
        elif d["kind"] == "Pod":
            pods.append((f"Pod/{d['metadata']['name']}", d["spec"]))
    return pods


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_pod_has_a_memory_request_and_limit(name: str) -> None:
    """In every profile every container of every pod (gateway, inferplaned, migration
    Job, helm test pod) has a memory request and a memory limit; a resources block
    without them is refused by the schema."""
    pods = _pods(render(PROFILES[name]))
    assert "Pod" in {p.split("/")[0] for p, _ in pods}  # the helm test pod too
    for pod, spec in pods:
        for c in spec.get("initContainers", []) + spec["containers"]:
            res = c.get("resources") or {}
            assert res.get("requests", {}).get("memory"), (pod, c["name"], res)
            assert res.get("limits", {}).get("memory"), (pod, c["name"], res)
    for section in ("gateway", "controlplane", "migrations", "tests"):
        with pytest.raises(helm.HelmError):
            helm.Chart.load(CHART).validate_schema({section: {"resources": None}})
        with pytest.raises(helm.HelmError):
            helm.Chart.load(CHART).validate_schema(
                {section: {"resources": {"limits": {"memory": None}}}})
