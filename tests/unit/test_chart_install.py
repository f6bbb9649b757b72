"""docs/deploy.md's install commands match what the chart reads.

The "Install" section's ``kubectl create secret`` commands, its ``helm install`` line
and its ``values.yaml`` are read from the page as written; the chart is rendered with
those values, release name and namespace, and every Secret key the objects read (by
``secretKeyRef``, a projected volume item, or a ``file:`` reference under a mounted
Secret) must be one the commands create — and each created key must be read.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (test extra) renders the chart")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "docs" / "deploy.md"


def _install_blocks() -> tuple[str, dict[str, Any]]:
    """The Install section's sh block and its values.yaml, as written."""
    text = DEPLOY.read_text()
    section = text.split("### Install\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
    [sh] = [body for lang, body in blocks if lang == "sh"]
    [values] = [body for lang, body in blocks if lang == "yaml"]
    assert values.startswith("# values.yaml\n")
    return sh, yaml.safe_load(values)


def _commands(sh: str) -> list[list[str]]:
    return [shlex.split(line) for line in sh.replace("\\\n", " ").splitlines() if line.strip()]


def _created(commands: list[list[str]]) -> tuple[str, set[tuple[str, str]]]:
    """The namespace and the (Secret, key) pairs the kubectl commands create."""
    created: set[tuple[str, str]] = set()
    namespaces = set()
    for argv in commands:
        if argv[:1] != ["kubectl"] or "secret" not in argv:
            continue
        namespaces.add(argv[argv.index("-n") + 1])
        name = argv[argv.index("generic") + 1]
        created |= {(name, a.split("=", 2)[1]) for a in argv if a.startswith("--from-literal=")}
    [namespace] = namespaces
    return namespace, created


def _read(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Every (Secret, key) the rendered objects read."""
    files = set()
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            for text in doc.get("data", {}).values():
                files |= set(re.findall(r"file:(/[^\"'\s}]+)", text))
    found: set[tuple[str, str]] = set()

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            ref = obj.get("secretKeyRef")
            if isinstance(ref, dict):
                found.add((ref["name"], ref["key"]))
            for value in obj.values():
                walk(value)
        elif isinstance(obj, list):
            for value in obj:
                walk(value)

    for doc in docs:
        walk(doc)
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if not spec:
            continue
        secrets = {v["name"]: v["secret"] for v in spec.get("volumes", []) if "secret" in v}
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            for mount in container.get("volumeMounts", []):
                secret = secrets.get(mount["name"])
                if secret is None:
                    continue
                keys = [i["key"] for i in secret.get("items", [])] or [
                    f.rsplit("/", 1)[1] for f in files
                    if f.rsplit("/", 1)[0] == mount["mountPath"].rstrip("/")]
                found |= {(secret["secretName"], key) for key in keys}
    return found


def test_the_documented_install_renders_with_exactly_the_secrets_it_creates() -> None:
    """docs/deploy.md: the Secrets its kubectl commands create are exactly the ones the
    chart, rendered with its values.yaml under its helm install line, reads."""
    sh, values = _install_blocks()
    commands = _commands(sh)
    [install] = [argv for argv in commands if argv[:2] == ["helm", "install"]]
    release, chart = install[2], ROOT / install[3]
    assert install[install.index("-f") + 1] == "values.yaml"
    namespace, created = _created(commands)
    assert install[install.index("-n") + 1] == namespace
    assert ["kubectl", "create", "namespace", namespace] in commands
    loaded = helm.Chart.load(chart)
    loaded.validate_schema(values)
    manifests = loaded.render(values, name=release, namespace=namespace, is_install=True)
    docs = [d for text in manifests.values() for d in yaml.safe_load_all(text) if d]
    read = _read(docs)
    assert read == created, (sorted(read), sorted(created))
    assert ("inferplane-database", "url") in read and ("inferplaned-tokens", "writer") in read
    assert not helm.lint(chart, values, strict=True)["errors"]
