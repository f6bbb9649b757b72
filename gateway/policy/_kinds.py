"""The RoutingPolicy and GuardrailPolicy kinds (``inferplane.dev/v1alpha1``).

Published by ``inferplaned`` next to GovernancePolicy documents (same store, same
generations, same hot reload): a RoutingPolicy overrides how a model's requests are
spread over its deployments (``models[].routing`` and each deployment's ``weight`` /
``maxInflight``); a GuardrailPolicy guards one team, or every team (``subject: {kind:
org}``), with detector actions and tenant regexes (RE2, linear time: a pattern that is
not, or that is too large, is refused at publish, with its path).

Example::

    apiVersion: inferplane.dev/v1alpha1
    kind: RoutingPolicy
    metadata: {name: sonnet}
    spec:
      models:
        - model: claude-sonnet
          strategy: weighted
          deployments:
            - {name: bedrock-east, weight: 0}
            - {name: anthropic, weight: 100}
    ---
    apiVersion: inferplane.dev/v1alpha1
    kind: GuardrailPolicy
    metadata: {name: payments}
    spec:
      subject: {kind: team, team: payments}
      actions: {card: block, aws_key: block}
      rules:
        - {name: customer_id, pattern: 'CUST-[0-9]{8}', action: mask}

What a document names that the gateway does not have (a model, a deployment) is checked
where the document is applied, not at publish: inferplaned does not know each gateway's
configuration (:func:`routing_problems`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import msgspec

from gateway.policy._wire import ObjectMeta, SubjectName, _Document, _Wire

DetectorAction = Literal["off", "monitor", "mask", "pseudonymize", "block"]
RuleNamePattern = r"^[a-z][a-z0-9_]{0,39}$"
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
DeploymentName = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
Weight = Annotated[int, msgspec.Meta(ge=0, le=1000)]
InFlight = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
MAX_MODELS = 256
MAX_RULES = 64


# -- RoutingPolicy ------------------------------------------------------------------------


class DeploymentRoute(_Wire, frozen=True):
    """One deployment of the model, by its routing name (``name``, else
    ``provider/upstream_model``, as docs/routing.md and the admin view show it)."""

    name: DeploymentName
    weight: Weight | None = None
    max_inflight: InFlight | None = msgspec.field(default=None, name="maxInflight")


class ModelRoute(_Wire, frozen=True):
    model: ModelName
    strategy: Literal["ordered", "weighted", "least_busy"] | None = None
    deployments: list[DeploymentRoute] = []


class RoutingSpec(_Wire, frozen=True):
    models: Annotated[list[ModelRoute], msgspec.Meta(max_length=MAX_MODELS)]
    description: str | None = None


class RoutingPolicy(_Document, frozen=True):
    kind: Literal["RoutingPolicy"]
    metadata: ObjectMeta
    spec: RoutingSpec


# -- GuardrailPolicy ----------------------------------------------------------------------


class GuardrailSubject(_Wire, frozen=True):
    """``{kind: team, team: NAME}`` (one team, by name) or ``{kind: org}`` (every team)."""

    kind: Literal["team", "org"]
    team: SubjectName | None = None


class TenantRule(_Wire, frozen=True):
    name: Annotated[str, msgspec.Meta(pattern=RuleNamePattern)]
    pattern: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    action: DetectorAction = "mask"
    kind: Literal["pii", "secret", "injection"] = "pii"


class GuardrailSpec(_Wire, frozen=True):
    subject: GuardrailSubject
    actions: dict[str, DetectorAction] = {}
    rules: Annotated[list[TenantRule], msgspec.Meta(max_length=MAX_RULES)] = []
    description: str | None = None


class GuardrailPolicy(_Document, frozen=True):
    kind: Literal["GuardrailPolicy"]
    metadata: ObjectMeta
    spec: GuardrailSpec


# -- semantic checks (the structural ones come from the types) -----------------------------


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def routing_semantic(doc: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(_list(_obj(_obj(doc).get("spec")).get("models"))):
        entry = _obj(entry)
        path = f"spec.models[{i}]"
        model = entry.get("model")
        if isinstance(model, str):
            if model in seen:
                out.append((f"{path}.model", f"model {model!r} is already routed by "
                                             f"spec.models[{seen[model]}]"))
            seen.setdefault(model, i)
        deployments = _list(entry.get("deployments"))
        if entry.get("strategy") is None and not deployments:
            out.append((path, "routes nothing (set strategy, or deployments)"))
        names: dict[str, int] = {}
        for j, dep in enumerate(deployments):
            dep = _obj(dep)
            name = dep.get("name")
            where = f"{path}.deployments[{j}]"
            if isinstance(name, str):
                if name in names:
                    out.append((f"{where}.name", f"deployment {name!r} is already named "
                                                 f"by deployments[{names[name]}]"))
                names.setdefault(name, j)
            if dep.get("weight") is None and dep.get("maxInflight") is None:
                out.append((where, "sets nothing (set weight and/or maxInflight)"))
    return out


def guardrail_semantic(doc: Any) -> list[tuple[str, str]]:
    from gateway.guardrails import NAMES, vet

    spec = _obj(_obj(doc).get("spec"))
    out: list[tuple[str, str]] = []
    subject = _obj(spec.get("subject"))
    if subject.get("kind") == "team" and subject.get("team") is None:
        out.append(("spec.subject.team", "required for kind team (a team name)"))
    if subject.get("kind") == "org" and subject.get("team") is not None:
        out.append(("spec.subject.team", "not allowed for kind org (it covers every team)"))
    if subject.get("team") == "*":
        out.append(("spec.subject.team", "use kind: org for every team"))
    for name in _obj(spec.get("actions")):
        if name not in NAMES:
            out.append((f"spec.actions.{name}", f"unknown detector (known: "
                                                f"{', '.join(NAMES)})"))
    seen: dict[str, int] = {}
    for i, rule in enumerate(_list(spec.get("rules"))):
        rule = _obj(rule)
        path = f"spec.rules[{i}]"
        rname, pattern = rule.get("name"), rule.get("pattern")
        if isinstance(rname, str):
            if rname in seen:
                out.append((f"{path}.name", f"duplicate rule name {rname!r} "
                                            f"(also spec.rules[{seen[rname]}])"))
            elif rname in NAMES:
                out.append((f"{path}.name", f"{rname!r} is a built-in detector's name "
                                            "(set its action under actions)"))
            seen.setdefault(rname, i)
        if isinstance(pattern, str) and 0 < len(pattern) <= 512:
            try:
                vet(pattern)
            except ValueError as exc:
                out.append((f"{path}.pattern", str(exc)))
    return out


# -- compiled forms ------------------------------------------------------------------------


class CompiledRouting(msgspec.Struct, frozen=True, kw_only=True):
    """One model's routing overrides from one RoutingPolicy document."""

    policy: str
    model: str
    strategy: Literal["ordered", "weighted", "least_busy"] | None = None
    weights: dict[str, int] = {}
    max_inflight: dict[str, int] = {}


class CompiledGuardrails(msgspec.Struct, frozen=True, kw_only=True):
    """One GuardrailPolicy: its subject (``team`` None: every team), its actions and
    tenant rules (the shape of a ``guardrails.profiles`` entry)."""

    policy: str
    team: str | None
    actions: dict[str, DetectorAction] = {}
    rules: tuple[TenantRule, ...] = ()


def compile_routing(doc: RoutingPolicy) -> tuple[CompiledRouting, ...]:
    return tuple(
        CompiledRouting(
            policy=doc.metadata.name, model=m.model, strategy=m.strategy,
            weights={d.name: d.weight for d in m.deployments if d.weight is not None},
            max_inflight={d.name: d.max_inflight for d in m.deployments
                          if d.max_inflight is not None})
        for m in doc.spec.models)


def compile_guardrails(doc: GuardrailPolicy) -> CompiledGuardrails:
    s = doc.spec
    return CompiledGuardrails(policy=doc.metadata.name,
                              team=s.subject.team if s.subject.kind == "team" else None,
                              actions=dict(s.actions), rules=tuple(s.rules))


def set_problems(docs: Iterable[tuple[str, RoutingPolicy | GuardrailPolicy]]
                 ) -> list[tuple[str, str]]:
    """Across a set: one RoutingPolicy per model, one GuardrailPolicy per subject (so
    which one applies never depends on document order)."""
    out: list[tuple[str, str]] = []
    models: dict[str, str] = {}
    subjects: dict[str, str] = {}
    for label, doc in docs:
        if isinstance(doc, RoutingPolicy):
            for i, m in enumerate(doc.spec.models):
                if m.model in models and models[m.model] != doc.metadata.name:
                    out.append((f"{label}:spec.models[{i}].model",
                                f"model {m.model!r} is already routed by the document "
                                f"{models[m.model]!r}"))
                models.setdefault(m.model, doc.metadata.name)
        else:
            s = doc.spec.subject
            key = f"team {s.team!r}" if s.kind == "team" else "the org"
            if key in subjects:
                out.append((f"{label}:spec.subject", f"{key} already has the guardrail "
                                                     f"document {subjects[key]!r}"))
            subjects.setdefault(key, doc.metadata.name)
    return out


def routing_problems(routes: Iterable[CompiledRouting],
                     deployments: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """What a gateway with these models (model → its deployments' routing names) cannot
    apply: a model it does not serve, a deployment the model does not have."""
    out: list[tuple[str, str]] = []
    for r in routes:
        names = deployments.get(r.model)
        if names is None:
            out.append((r.model, f"model {r.model!r} is not configured on this gateway"))
            continue
        known = set(names)
        for name in sorted({*r.weights, *r.max_inflight} - known):
            out.append((r.model, f"model {r.model!r} has no deployment {name!r} on this "
                                 f"gateway (it has: {', '.join(sorted(known))})"))
    return out
