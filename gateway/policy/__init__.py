"""Policy documents (inferplane.dev/v1alpha1: GovernancePolicy, RoutingPolicy,
GuardrailPolicy): wire types, validation, merge, compilation.

Imported by both binaries, so a schema skew between mayu and inferplaned is an import
error rather than a surprise in production.
"""

from gateway.policy._compile import (
    canonical_json,
    compile_all,
    compile_documents,
    decode_documents,
    fingerprint,
)
from gateway.policy._compiled import EMPTY_SNAPSHOT, CompiledRule, PolicySnapshot
from gateway.policy._files import FilePolicySource, check_files
from gateway.policy._kinds import (
    CompiledGuardrails,
    CompiledRouting,
    GuardrailPolicy,
    RoutingPolicy,
    routing_problems,
)
from gateway.policy._merge import EffectiveLimits, effective_limits, tightest_renew_ms
from gateway.policy._overlay import deployment_routing_names, routed_model, tenant_guardrails
from gateway.policy._pgstore import (
    CurrentPolicy,
    GenerationInfo,
    PolicyChange,
    PostgresPolicySource,
    changes,
    current,
    publish,
)
from gateway.policy._source import PolicySource, StaticPolicySource
from gateway.policy._validate import PolicyInvalid, validate_document, validate_documents
from gateway.policy._wire import (
    API_VERSION,
    BudgetRule,
    GovernancePolicy,
    Lease,
    ObjectMeta,
    PolicySpec,
    RateRule,
    Rule,
    Subject,
    TokenQuota,
)

__all__ = [
    "CompiledGuardrails",
    "CompiledRouting",
    "GuardrailPolicy",
    "RoutingPolicy",
    "routing_problems",
    "compile_all",
    "deployment_routing_names",
    "routed_model",
    "tenant_guardrails",
    "API_VERSION",
    "BudgetRule",
    "GovernancePolicy",
    "Lease",
    "ObjectMeta",
    "PolicyInvalid",
    "PolicySpec",
    "RateRule",
    "Rule",
    "Subject",
    "TokenQuota",
    "canonical_json",
    "compile_documents",
    "decode_documents",
    "effective_limits",
    "check_files",
    "fingerprint",
    "tightest_renew_ms",
    "validate_document",
    "validate_documents",
    "EMPTY_SNAPSHOT",
    "CompiledRule",
    "CurrentPolicy",
    "GenerationInfo",
    "PolicyChange",
    "PostgresPolicySource",
    "changes",
    "current",
    "publish",
    "EffectiveLimits",
    "FilePolicySource",
    "PolicySnapshot",
    "PolicySource",
    "StaticPolicySource",
]
