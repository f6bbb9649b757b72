"""mayu: the inferplane data plane (gateway).

Sub-packages are cut by domain: ``config`` (typed settings), ``keys`` (virtual keys,
teams, principals), ``pricing`` (integer µUSD arithmetic), ``policy`` (GovernancePolicy
wire types shared with inferplaned), ``governance`` (the admission/settlement seam and its
local and shared-Postgres stores), ``providers`` (upstream clients), ``ingress`` (the
OpenAI- and Anthropic-shaped HTTP surface), ``usage`` (usage extraction from responses
and streams).
"""

__version__ = "0.1.0"
