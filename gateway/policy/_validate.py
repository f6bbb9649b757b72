"""Validation of GovernancePolicy documents, reporting every problem with its field path.

Two passes per document. The *structural* pass walks the raw mapping against the wire
types' msgspec type information (so the Structs stay the single definition of the shape)
and reports every unknown field, missing field, wrong type and out-of-range value, not
just the first as ``msgspec.convert`` would. The *semantic* pass checks what relates
several fields: one rule type per rule, ``unlimited`` versus limits (ADR-039), subjects,
``tokenQuota`` needing ``FailClosed``, key subjects taking only ``concurrency``, leases.
Across a set, document names and rule uids must be unique. Nothing is rounded: a
fractional milliUSD is an error.

The ``kind`` picks the document's type: GovernancePolicy, or the RoutingPolicy and
GuardrailPolicy kinds of :mod:`gateway.policy._kinds` (same two passes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, TypeGuard

import msgspec
from msgspec import inspect as mi

from gateway.errors import InferplaneError
from gateway.policy._kinds import (
    GuardrailPolicy,
    RoutingPolicy,
    guardrail_semantic,
    routing_semantic,
    set_problems,
)
from gateway.policy._wire import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    DURATION_PATTERN,
    MAX_RENEW_MS,
    MIN_RENEW_MS,
    UID_PATTERN,
    GovernancePolicy,
    Rule,
    duration_ms,
    rule_uid,
)

Problem = tuple[str, str]

_PATTERN_HINTS = {
    DNS_LABEL: "must be a lowercase DNS label (a-z, 0-9, '-', at most 63 characters)",
    DNS_SUBDOMAIN: "must be a lowercase DNS name (a-z, 0-9, '-', '.')",
    UID_PATTERN: "must be letters, digits, '.', '_', '/', '-' (no ':')",
    DURATION_PATTERN: "must be a duration such as 500ms, 10s, 1m30s",
}
_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string",
               list: "list", dict: "mapping", type(None): "null"}


class PolicyInvalid(InferplaneError):
    """The policy document set is invalid; nothing was applied."""

    status = 422
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "policy_invalid"

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        shown = "; ".join(f"{path}: {msg}" for path, msg in self.problems[:20])
        more = len(self.problems) - 20
        suffix = f"; and {more} more" if more > 0 else ""
        count = len(self.problems)
        super().__init__(f"invalid policy ({count} problem{'s' * (count != 1)}): "
                         f"{shown}{suffix}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _check(value: Any, t: Any, path: str, out: list[Problem]) -> None:
    """Structural check of ``value`` against msgspec type info ``t``; appends problems."""
    if isinstance(t, mi.UnionType):
        if value is None and any(isinstance(x, mi.NoneType) for x in t.types):
            return
        t = next(x for x in t.types if not isinstance(x, mi.NoneType))
    if isinstance(t, mi.StructType):
        _check_struct(value, t, path, out)
    elif isinstance(t, mi.ListType):
        if not isinstance(value, list):
            out.append((path, f"must be a list, got {_type_name(value)}"))
            return
        for i, item in enumerate(value):
            _check(item, t.item_type, f"{path}[{i}]", out)
    elif isinstance(t, mi.DictType):
        if not isinstance(value, dict):
            out.append((path, f"must be a mapping, got {_type_name(value)}"))
            return
        for k, v in value.items():
            _check(k, t.key_type, path, out)
            _check(v, t.value_type, _join(path, str(k)), out)
    elif isinstance(t, mi.StrType):
        _check_str(value, t, path, out)
    elif isinstance(t, mi.IntType):
        _check_int(value, t, path, out)
    elif isinstance(t, mi.BoolType):
        if not isinstance(value, bool):
            out.append((path, f"must be true or false, got {_type_name(value)}"))
    elif isinstance(t, mi.LiteralType) and (not isinstance(value, str)
                                            or value not in t.values):
        allowed = ", ".join(map(str, t.values))
        out.append((path, f"must be one of {allowed}; got {value!r}"))


def _check_struct(value: Any, t: mi.StructType, path: str, out: list[Problem]) -> None:
    if not isinstance(value, dict):
        out.append((path or "$", f"must be a mapping, got {_type_name(value)}"))
        return
    fields = {f.encode_name: f for f in t.fields}
    for key in value:
        if key not in fields:
            why = ("not a rule type or rule field this gateway can enforce"
                   if t.cls is Rule else "unknown field")
            out.append((_join(path, str(key)), f"{why} (known: {', '.join(fields)})"))
    for name, field in fields.items():
        if name in value:
            _check(value[name], field.type, _join(path, name), out)
        elif field.required:
            out.append((_join(path, name), "required"))


def _check_str(value: Any, t: mi.StrType, path: str, out: list[Problem]) -> None:
    if not isinstance(value, str):
        out.append((path, f"must be a string, got {_type_name(value)}"))
    elif t.min_length is not None and len(value) < t.min_length:
        out.append((path, "must not be empty"))
    elif t.max_length is not None and len(value) > t.max_length:
        out.append((path, f"must be at most {t.max_length} characters"))
    elif t.pattern is not None and not re.search(t.pattern, value):
        out.append((path, f"{_PATTERN_HINTS.get(t.pattern, 'invalid format')}; got {value!r}"))


def _check_int(value: Any, t: mi.IntType, path: str, out: list[Problem]) -> None:
    if isinstance(value, float) and not isinstance(value, bool):
        # Never round money or limits through a float: 1.5 milliUSD is an error, not 2.
        out.append((path, f"must be an integer (fractions are refused, never rounded); "
                          f"got {value!r}"))
        return
    if not isinstance(value, int) or isinstance(value, bool):
        out.append((path, f"must be an integer, got {_type_name(value)}"))
        return
    if t.gt is not None and not value > t.gt:
        out.append((path, f"must be > {t.gt}"))
    if t.ge is not None and not value >= t.ge:
        out.append((path, f"must be >= {t.ge}"))
    if t.le is not None and not value <= t.le:
        out.append((path, f"must be <= {t.le}"))


_POLICY_TYPE = mi.type_info(GovernancePolicy)

Document = GovernancePolicy | RoutingPolicy | GuardrailPolicy
"""A decoded document of any kind this build knows."""

_KINDS: dict[str, tuple[type[Any], Any, Any]] = {
    "RoutingPolicy": (RoutingPolicy, mi.type_info(RoutingPolicy), routing_semantic),
    "GuardrailPolicy": (GuardrailPolicy, mi.type_info(GuardrailPolicy), guardrail_semantic),
}
"""The kinds besides GovernancePolicy: (type, its msgspec type info, semantic checks)."""


# The semantic checks read the raw mappings by *presence* (a key with a non-null value),
# like the CRD's CEL rules do, so they run on every rule, even one with a structural
# error elsewhere: every problem is reported at once, not one layer at a time.

_NO_CAP = "not allowed with unlimited: true (an unlimited rule declares no cap)"


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _has(obj: dict[str, Any], key: str) -> bool:
    return obj.get(key) is not None


def _rate_problems(rate: dict[str, Any], path: str) -> list[Problem]:
    if rate.get("unlimited") is True:
        return [(f"{path}.{f}", _NO_CAP) for f in ("rpm", "tpm") if _has(rate, f)]
    if not (_has(rate, "rpm") or _has(rate, "tpm")):
        return [(path, "limits neither rpm nor tpm (set at least one, or unlimited: true)")]
    return []


def _is_count(value: object) -> TypeGuard[int]:
    """An int proper: YAML ``true`` is a bool, which Python also counts as an int."""
    return isinstance(value, int) and not isinstance(value, bool)


def _lease_problems(budget: dict[str, Any], path: str) -> list[Problem]:
    lease, out = _obj(budget.get("lease")), []
    renew, grant, limit = lease.get("renewInterval"), lease.get("grant"), budget.get(
        "limitMilliUSD")
    # A string over 32 characters is refused by the structural pass (and int() of a
    # very long digit run would raise).
    if isinstance(renew, str) and len(renew) <= 32 and re.search(DURATION_PATTERN, renew):
        ms, where = duration_ms(renew), f"{path}.lease.renewInterval"
        if ms < MIN_RENEW_MS:
            out.append((where, "must be at least 1s"))
        elif ms > MAX_RENEW_MS:
            out.append((where, f"must be at most {MAX_RENEW_MS // 3_600_000}h; got {renew!r}"))
    if _is_count(grant) and _is_count(limit) and grant > limit:
        out.append((f"{path}.lease.grant", "must not exceed limitMilliUSD"))
    return out


def _budget_problems(budget: dict[str, Any], path: str) -> list[Problem]:
    if budget.get("unlimited") is True:
        return [(f"{path}.{f}", _NO_CAP)
                for f in ("limitMilliUSD", "hardCap", "lease", "adminContact",
                          "onShortfall", "fitFloorTokens")
                if _has(budget, f)]
    out: list[Problem] = []
    if _has(budget, "fitFloorTokens") and budget.get("onShortfall") != "fit":
        out.append((f"{path}.fitFloorTokens", "only with onShortfall: fit"))
    if not _has(budget, "limitMilliUSD"):
        out.append((f"{path}.limitMilliUSD", "required (or unlimited: true)"))
    if not _has(budget, "window"):
        out.append((f"{path}.window", "required: day or month"))
    return out + _lease_problems(budget, path)


_SUBJECT_FIELDS = {"team": ("team",), "user": ("user",), "team-user": ("team", "user"),
                   "key": ("key",)}
"""The name fields each subject kind requires (the others are refused)."""


def _subject_problems(subject: dict[str, Any], path: str) -> list[Problem]:
    kind, out = subject.get("kind"), []
    if not isinstance(kind, str) or kind not in _SUBJECT_FIELDS:
        return []  # the structural pass reports the kind itself
    for field in ("team", "user", "key"):
        needed = field in _SUBJECT_FIELDS[kind]
        if needed and not _has(subject, field):
            out.append((f"{path}.subject.{field}", f"required for kind {kind} "
                                                   "(a name, or * for all)"))
        elif not needed and _has(subject, field):
            out.append((f"{path}.subject.{field}", f"not allowed for kind {kind}"))
    return out


def _rule_problems(rule: dict[str, Any], path: str) -> list[Problem]:
    subject = _obj(rule.get("subject"))
    out = _subject_problems(subject, path)
    kinds = [k for k in ("rate", "budget", "tokenQuota", "concurrency") if _has(rule, k)]
    if len(kinds) != 1:
        found = ", ".join(kinds) or "none"
        out.append((path, f"exactly one of rate, budget, tokenQuota, concurrency is "
                          f"required (found: {found})"))
    if subject.get("kind") == "key" and any(k != "concurrency" for k in kinds):
        out.append((f"{path}.subject.kind", "kind key takes only a concurrency rule (a "
                                            "key's rates and money limits are the key's "
                                            "own fields)"))
    if _has(rule, "rate"):
        out += _rate_problems(_obj(rule["rate"]), f"{path}.rate")
    if _has(rule, "budget"):
        out += _budget_problems(_obj(rule["budget"]), f"{path}.budget")
    if _has(rule, "tokenQuota"):
        quota = _obj(rule["tokenQuota"])
        if not (_has(quota, "day") or _has(quota, "month")):
            out.append((f"{path}.tokenQuota", "limits neither day nor month"))
        if rule.get("failurePolicy") == "FailOpen":
            # A quota that fails open while storage is down would not be a quota.
            out.append((f"{path}.failurePolicy", "tokenQuota rules require FailClosed"))
    return out


def _semantic_problems(doc: Any) -> list[Problem]:
    spec = _obj(doc.get("spec") if isinstance(doc, dict) else None)
    rules = spec.get("rules")
    if not isinstance(rules, list):
        return []
    out: list[Problem] = []
    names: dict[str, int] = {}
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        path = f"spec.rules[{i}]"
        out += _rule_problems(rule, path)
        name = rule.get("name")
        if isinstance(name, str) and name in names:
            out.append((f"{path}.name", f"duplicate rule name {name!r} "
                                        f"(also spec.rules[{names[name]}])"))
        if isinstance(name, str):
            names.setdefault(name, i)
    return out


def validate_document(doc: Any) -> tuple[Document | None, list[Problem]]:
    """Check one document; returns the decoded document (if structurally sound) and
    problems. The ``kind`` field picks the type (GovernancePolicy when it names none
    this build knows, so an unknown kind is reported against the known ones).

    Paths are relative to the document (``spec.rules[2].budget.limitMilliUSD``).
    """
    if isinstance(doc, GovernancePolicy | RoutingPolicy | GuardrailPolicy):
        doc = msgspec.to_builtins(doc)
    kind = doc.get("kind") if isinstance(doc, dict) else None
    cls: type[Any]
    if isinstance(kind, str) and kind in _KINDS:
        cls, info, semantic = _KINDS[kind]
    else:
        cls, info, semantic = GovernancePolicy, _POLICY_TYPE, _semantic_problems
    structural: list[Problem] = []
    _check(doc, info, "", structural)
    if cls is GovernancePolicy and isinstance(kind, str) and kind != "GovernancePolicy":
        known = ", ".join(["GovernancePolicy", *_KINDS])
        structural = [(p, f"must be one of {known}; got {kind!r}") if p == "kind"
                      else (p, m) for p, m in structural]
    problems = structural + semantic(doc)
    if structural:
        return None, problems
    try:
        policy: Document = msgspec.convert(doc, cls)
    except msgspec.ValidationError as exc:  # the walker should have caught it; be safe
        return None, [("$", str(exc))]
    return policy, problems


def document_label(doc: Any, index: int) -> str:
    """How a document is named in problem paths: its metadata.name, else its position."""
    if isinstance(doc, GovernancePolicy | RoutingPolicy | GuardrailPolicy):
        return doc.metadata.name
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name else f"documents[{index}]"


def validate_documents(docs: Sequence[Any], *, origins: Sequence[str] | None = None
                       ) -> tuple[list[Document], list[Problem]]:
    """Check a whole set; every path is prefixed with its document (``name:path``).

    ``origins`` (one per document, e.g. ``policies/a.yaml``) is prepended to the label
    so a problem also names the file it is in (``policies/a.yaml:name:path``).
    """
    policies: list[Document] = []
    problems: list[Problem] = []
    seen_names: dict[str, str] = {}
    seen_uids: dict[str, str] = {}
    others: list[tuple[str, RoutingPolicy | GuardrailPolicy]] = []
    for i, doc in enumerate(docs):
        label = document_label(doc, i)
        if origins is not None and origins[i] != label:
            label = f"{origins[i]}:{label}"
        policy, doc_problems = validate_document(doc)
        problems += [(f"{label}:{p}", m) for p, m in doc_problems]
        if policy is None:
            continue
        name = policy.metadata.name
        if name in seen_names:
            problems.append((f"{label}:metadata.name", f"duplicate policy name {name!r} "
                                                       f"(also {seen_names[name]})"))
        seen_names.setdefault(name, label)
        if not isinstance(policy, GovernancePolicy):
            others.append((label, policy))
        else:
            for j, rule in enumerate(policy.spec.rules):
                uid, where = rule_uid(name, rule), f"{label}:spec.rules[{j}]"
                if uid in seen_uids:
                    problems.append((f"{where}.uid", f"duplicate rule uid {uid!r} "
                                                     f"(also {seen_uids[uid]})"))
                seen_uids.setdefault(uid, where)
        if not doc_problems:
            policies.append(policy)
    problems += set_problems(others)
    return policies, problems
