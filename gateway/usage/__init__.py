"""Usage extraction: what an upstream reported, from a JSON body or an SSE stream.

(The ``/v1/usage`` report lives in the ingress; this package only reads responses.)
"""

from gateway.usage._estimate import estimate_tokens, prompt_text, text_strings
from gateway.usage._map import from_anthropic, from_openai, from_responses
from gateway.usage._stream import Endpoint, StreamMeter, extract_json, stream_error_event

__all__ = [
    "Endpoint",
    "StreamMeter",
    "estimate_tokens",
    "extract_json",
    "from_anthropic",
    "from_openai",
    "from_responses",
    "prompt_text",
    "stream_error_event",
    "text_strings",
]
