"""A request's bounds as one value: its input and output tokens and the µUSD bound they make.

The ingress builds a request's :class:`Bounds` once (``gateway.ingress._prepare``: the
body's bytes or its count, its output limit, the price classes its input can land in) and
from then on only replaces it by a new value from a named step:

- :meth:`Bounds.with_counted_input`: the off-loop count of a large body (the byte bound
  itself is lowered: the count is the model's, every deployment's);
- :meth:`Bounds.with_input`: a refinement by the provider's count (``counted``,
  ``counted-prefix``, or ``byte-count-failed`` saying why the byte bound stands);
- :meth:`Bounds.with_output`: an output cap or budget fit's lower allowance;
- :meth:`Bounds.unrefined`: back to the byte bound for another deployment.

The µUSD bound is :func:`gateway.pricing.cost_bound_micro_usd` of the two token bounds,
derived here (:attr:`Bounds.usd`, :meth:`Bounds.usd_of`) and nowhere else, so budget fit,
refusals, the plan and the response headers always agree on it.
"""

from __future__ import annotations

import msgspec
from msgspec.structs import force_setattr, replace

from gateway.pricing import INPUT_CLASSES, ModelPrice, cost_bound_micro_usd

BYTE, PREFIX, COUNTED, FAILED = "byte", "counted-prefix", "counted", "byte-count-failed"
"""What the input bound rests on, as the ``x-inferplane-input-bound`` header says it."""


class Bounds(msgspec.Struct, frozen=True):
    """The most a request can be charged: tokens in, tokens out, and their µUSD."""

    input_tokens: int
    output_tokens: int
    price: ModelPrice
    input_classes: frozenset[str] = INPUT_CLASSES
    """The price classes its input can be billed in (``gateway.ingress._bounds``)."""
    choices: int = 1
    """A chat request's ``n``: its output limit is per choice, ``output_tokens`` the
    total the request may generate."""
    byte_input: int = 0
    """The input bound before any refinement (0: ``input_tokens``)."""
    input_basis: str = BYTE
    input_note: str = ""
    """How a refined input bound was had, for refusals and budget-fit headers."""
    counted: bool = False
    """The provider was asked for a count of this input (at most once per deployment)."""
    usd: int = 0
    """The µUSD bound: :meth:`usd_of` the output allowance, derived from the fields above
    whenever a value is made (never given)."""

    def __post_init__(self) -> None:
        if not self.byte_input:
            force_setattr(self, "byte_input", self.input_tokens)
        force_setattr(self, "usd", self.usd_of(self.output_tokens))

    @property
    def tokens(self) -> int:
        """The token bound: input plus output."""
        return self.input_tokens + self.output_tokens

    @property
    def refined(self) -> bool:
        """The input bound rests on something other than the body's bytes."""
        return self.input_basis != BYTE

    def usd_of(self, output_tokens: int) -> int:
        """The µUSD bound of the same request with ``output_tokens`` output tokens."""
        return cost_bound_micro_usd(self.input_tokens, output_tokens, self.price,
                                    input_classes=self.input_classes)

    def with_counted_input(self, tokens: int) -> Bounds:
        """The byte bound lowered to a count of the body's text (every deployment's)."""
        if tokens >= self.byte_input:
            return self
        return replace(self, input_tokens=tokens, byte_input=tokens)

    def with_input(self, tokens: int, basis: str, note: str) -> Bounds:
        """The input bounded by ``tokens`` (a refinement); a bound above the current one
        changes only the basis, when it says why the byte bound stands (the lower of two
        sound bounds is sound)."""
        if tokens >= self.input_tokens:
            if self.input_basis == BYTE and basis == FAILED:
                return replace(self, input_basis=basis, input_note=note, counted=True)
            return replace(self, counted=self.counted or basis in (COUNTED, FAILED))
        return replace(self, input_tokens=tokens, input_basis=basis, input_note=note,
                       counted=self.counted or basis in (COUNTED, FAILED))

    def with_output(self, tokens: int) -> Bounds:
        """The same input with an output allowance of ``tokens`` (in all choices)."""
        return replace(self, output_tokens=tokens)

    def unrefined(self) -> Bounds:
        """Back to the byte bound (a refinement belongs to the deployment that counted)."""
        if self.input_basis == BYTE and not self.counted:
            return self
        return replace(self, input_tokens=self.byte_input, input_basis=BYTE,
                       input_note="", counted=False)

    def input_words(self) -> str:
        """The input bound in a refusal's words, with its basis."""
        if self.input_basis == BYTE:
            return f"up to {self.input_tokens} input tokens (bounded by the body's bytes)"
        return f"up to {self.input_tokens} input tokens ({self.input_note})"
