"""GovernancePolicy (inferplane.dev/v1alpha1): wire types, validation, merge, compilation.

Imported by both binaries, so a schema skew between mayu and inferplaned is an import
error rather than a surprise in production.
"""

from gateway.policy._compiled import EMPTY_SNAPSHOT, CompiledRule, PolicySnapshot
from gateway.policy._source import PolicySource, StaticPolicySource

__all__ = [
    "EMPTY_SNAPSHOT",
    "CompiledRule",
    "PolicySnapshot",
    "PolicySource",
    "StaticPolicySource",
]
