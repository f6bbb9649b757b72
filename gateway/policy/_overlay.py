"""Applying the published RoutingPolicy and GuardrailPolicy documents on a gateway.

Both overlay the gateway's own configuration, per field (docs/routing.md and
docs/guardrails.md, "Published by inferplaned"):

- a RoutingPolicy entry for a model replaces the ``strategy`` and the named deployments'
  ``weight`` / ``max_inflight`` it sets; everything else (cooldowns, affinity, dedupe,
  prices, the deployments themselves) stays as the config file says. A model without
  ``routing:`` in the file gets the defaults of ``routing:`` plus the document's fields.
- a GuardrailPolicy with ``subject: {kind: org}`` guards every team (as
  ``guardrails.enabled: true`` would), its actions over the file's; one for a team is
  applied after the team's own profiles. Built-in detectors run first, then the tenant
  rules in the order file → org document → team profiles → team document (ADR-050: the
  tenant's rules are evaluated after the V1 detectors); of two overlapping findings the
  earlier detector's is kept.

Each result is computed once per published generation (the snapshot object) and cached:
the request path does one dict lookup. What a routing document names that this gateway
does not have (a model, a deployment) is logged once per generation and that model's
entry is not applied (the file's routing stays): inferplaned cannot know each gateway's
deployments.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from msgspec.structs import replace

from gateway.policy._compiled import PolicySnapshot
from gateway.policy._kinds import CompiledRouting, routing_problems

if TYPE_CHECKING:
    from gateway.config import ModelSettings
    from gateway.guardrails import GuardrailSettings

log = logging.getLogger("mayu.policy")

PROFILE_PREFIX = "policy:"
"""A GuardrailPolicy document's profile name in the effective settings (no configured
profile can take it: profile names are lowercase labels)."""

_ROUTED: dict[int, tuple[PolicySnapshot, ModelSettings, ModelSettings]] = {}
"""id(the configured model) → (the snapshot, that model, the overlaid model)."""
_KEEP: list[ModelSettings] = []
"""Every overlaid model, kept: the router indexes a model's deployments by object id,
so an id must never be reused by a later generation's deployment (a generation is a
publish, an admin's act: a handful of small values each)."""
_GUARDED: dict[int, tuple[PolicySnapshot, GuardrailSettings, GuardrailSettings,
                          dict[str, str]]] = {}


def deployment_routing_names(model: ModelSettings) -> list[str]:
    from gateway.routing import deployment_names

    names = deployment_names(model)
    return [names[i] for i in range(len(model.deployments))]


def routed_model(model: ModelSettings, snapshot: PolicySnapshot) -> ModelSettings:
    """``model`` with its RoutingPolicy entry applied (``model`` itself if none)."""
    if not snapshot.routing:
        return model
    hit = _ROUTED.get(id(model))
    if hit is not None and hit[0] is snapshot and hit[1] is model:
        return hit[2]
    out = _route(model, snapshot)
    _ROUTED[id(model)] = (snapshot, model, out)
    if out is not model:
        _KEEP.append(out)
    return out


def _route(model: ModelSettings, snapshot: PolicySnapshot) -> ModelSettings:
    from gateway.config import RoutingSettings

    route: CompiledRouting | None = next(
        (r for r in snapshot.routing if r.model == model.name), None)
    if route is None:
        return model
    names = deployment_routing_names(model)
    problems = routing_problems([route], {model.name: names})
    if problems:
        log.error("routing document %s not applied to model %s (generation %d): %s",
                  route.policy, model.name, snapshot.generation,
                  "; ".join(m for _, m in problems))
        return model
    deployments = [
        replace(d, weight=route.weights.get(name, d.weight),
                max_inflight=route.max_inflight.get(name, d.max_inflight))
        for d, name in zip(model.deployments, names, strict=True)]
    routing = model.routing or RoutingSettings()
    if route.strategy is not None:
        routing = replace(routing, strategy=route.strategy)
    log.info("routing document %s applied to model %s (generation %d)", route.policy,
             model.name, snapshot.generation)
    return replace(model, deployments=deployments, routing=routing)


def tenant_guardrails(settings: GuardrailSettings, snapshot: PolicySnapshot, team: str,
                      profiles: tuple[str, ...]) -> tuple[GuardrailSettings, tuple[str, ...]]:
    """The guardrail settings and profile names a team's request is screened with."""
    if not snapshot.guardrails:
        return settings, profiles
    hit = _GUARDED.get(id(settings))
    if hit is None or hit[0] is not snapshot or hit[1] is not settings:
        effective, by_team = _guard(settings, snapshot)
        hit = (snapshot, settings, effective, by_team)
        _GUARDED[id(settings)] = hit
    profile = hit[3].get(team)
    return hit[2], profiles if profile is None else (*profiles, profile)


def _guard(settings: GuardrailSettings, snapshot: PolicySnapshot
           ) -> tuple[GuardrailSettings, dict[str, str]]:
    from gateway.guardrails import GuardrailProfile, GuardrailRule

    profiles = dict(settings.profiles)
    by_team: dict[str, str] = {}
    effective = settings
    for doc in snapshot.guardrails:
        rules = [GuardrailRule(name=r.name, pattern=r.pattern, action=r.action, kind=r.kind)
                 for r in doc.rules]
        if doc.team is None:
            effective = replace(effective, enabled=True,
                                actions={**effective.actions, **doc.actions},
                                rules=[*effective.rules, *rules])
            continue
        name = PROFILE_PREFIX + doc.policy
        profiles[name] = GuardrailProfile(actions=dict(doc.actions), rules=rules)
        by_team[doc.team] = name
    return replace(effective, profiles=profiles), by_team
