"""The chart's values for an external HA Postgres (docs/failover.md): every member, the
read-write attribute and TLS reach every pod that connects (gateways, inferplaned, the
migration Job) as libpq's environment, the CA bundle mounted where PGSSLROOTCERT says;
without them nothing changes; a malformed member is refused by the schema."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_chart import CHART, helm, render

HA: dict[str, Any] = {
    "profile": "shared", "controlplane": {"enabled": True},
    "database": {"existingSecret": "db", "secretKey": "url",
                 "hosts": [{"host": "pg-0.pg", "port": 5432}, {"host": "pg-1.pg"},
                           {"host": "pg-2.pg", "port": 6432}],
                 "tls": {"sslmode": "verify-full", "caSecret": "pg-ca"}}}


def _connecting(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec that gets INFERPLANE_DATABASE_URL, by its workload's name."""
    out = {}
    for doc in docs:
        pod = (doc.get("spec", {}).get("template", {}).get("spec")
               if doc["kind"] in ("StatefulSet", "Deployment", "Job", "DaemonSet") else None)
        if pod and any(e["name"] == "INFERPLANE_DATABASE_URL"
                       for c in pod["containers"] for e in c.get("env", [])):
            out[doc["metadata"]["name"]] = pod
    return out


def test_ha_values_reach_every_connecting_pod() -> None:
    """hosts, targetSessionAttrs and tls become PGHOST/PGPORT/PGTARGETSESSIONATTRS/
    PGSSLMODE/PGSSLROOTCERT on the gateways, inferplaned and the migration Job, each with
    the CA Secret mounted at the path PGSSLROOTCERT names; the chart lints."""
    pods = _connecting(render(HA))
    assert len(pods) == 3 and any("migrat" in n for n in pods), list(pods)
    for name, pod in pods.items():
        [container] = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PGHOST"] == "pg-0.pg,pg-1.pg,pg-2.pg", name
        assert env["PGPORT"] == "5432,5432,6432", name
        assert env["PGTARGETSESSIONATTRS"] == "read-write", name
        assert env["PGSSLMODE"] == "verify-full", name
        assert env["PGSSLROOTCERT"] == "/etc/inferplane/db-ca/ca.crt", name
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["db-ca"] == "/etc/inferplane/db-ca", name
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["db-ca"]["secret"]["secretName"] == "pg-ca", name
    report = helm.lint(CHART, HA, strict=True)
    assert report["errors"] == [], report


def test_without_ha_values_no_libpq_environment() -> None:
    """The default values add no PG* variable and no CA volume (the URL says it all)."""
    for name, pod in _connecting(render({"profile": "shared"})).items():
        [container] = pod["containers"]
        assert not [e for e in container["env"] if e["name"].startswith("PG")], name
        assert "db-ca" not in {v["name"] for v in pod.get("volumes", [])}, name


@pytest.mark.parametrize("hosts", [[{"host": "a,b"}], [{"port": 5432}],
                                   [{"host": "a", "port": 0}]])
def test_a_malformed_member_is_refused(hosts: list[dict[str, Any]]) -> None:
    """A host with a comma (two members in one), a member without a host, or port 0 is
    refused by values.schema.json before anything renders."""
    with pytest.raises(helm.HelmError):
        render({"profile": "shared", "database": {"existingSecret": "db",
                                                  "secretKey": "url", "hosts": hosts}})
