"""Bounds and upstream-body rewriting decided before admission."""

from __future__ import annotations

import json

import pytest

from gateway.config import Deployment, ModelSettings
from gateway.errors import BadRequest
from gateway.ingress._prepare import output_bound, parse_json, upstream_body

MODEL = ModelSettings(name="m", deployments=[Deployment(provider="p")], max_output_tokens=777)


def test_output_bound_uses_the_request_limit_or_the_model_ceiling() -> None:
    """max_tokens (or a variant) bounds the output; without it, the model's ceiling does."""
    assert output_bound({"max_tokens": 10}, "messages", MODEL, ceiling=1000) == 10
    assert output_bound({"max_completion_tokens": 12}, "chat", MODEL, ceiling=1000) == 12
    assert output_bound({"max_output_tokens": 14}, "responses", MODEL, ceiling=1000) == 14
    assert output_bound({}, "chat", MODEL, ceiling=1000) == 777
    assert output_bound({"max_tokens": 10}, "embeddings", MODEL, ceiling=1000) == 0


def test_output_bound_multiplies_by_choices() -> None:
    """n choices can each produce max_tokens."""
    assert output_bound({"max_tokens": 10, "n": 3}, "chat", MODEL, ceiling=1000) == 30


@pytest.mark.parametrize("doc", [{"max_tokens": -1}, {"max_tokens": 1.5},
                                 {"max_tokens": "9"}, {"max_tokens": 10**12},
                                 {"max_tokens": True}, {"max_tokens": 5, "n": 0}])
def test_bad_output_limits_are_400(doc: dict[str, object]) -> None:
    """Negative, non-integer or above-ceiling output limits are refused with 400."""
    with pytest.raises(BadRequest) as info:
        output_bound(doc, "chat", MODEL, ceiling=1000)
    assert info.value.status == 400


def _chat_upstream(body: bytes, *, stream: bool) -> tuple[bytes, bool]:
    """What :func:`upstream_body` sends for a chat ``body`` on a plain deployment."""
    return upstream_body(body, parse_json(body), Deployment(provider="p"), "chat",
                         stream=stream)


def test_body_is_forwarded_verbatim_when_nothing_changes() -> None:
    """Without a model rewrite or added stream option, the exact bytes go upstream."""
    body = b'{"model": "m",  "max_tokens": 3}'
    sent, strip = _chat_upstream(body, stream=False)
    assert sent is body and not strip


def test_chat_stream_gets_include_usage_and_strip_flag() -> None:
    """A chat stream without include_usage gets it upstream and strips the usage chunk."""
    body = b'{"model": "m", "stream": true}'
    sent, strip = _chat_upstream(body, stream=True)
    assert strip and json.loads(sent)["stream_options"] == {"include_usage": True}
    asked = b'{"model": "m", "stream": true, "stream_options": {"include_usage": true}}'
    sent, strip = _chat_upstream(asked, stream=True)
    assert sent is asked and not strip


def test_upstream_model_is_rewritten() -> None:
    """A deployment's upstream_model replaces the model field."""
    body = b'{"model": "m"}'
    sent, _ = upstream_body(body, parse_json(body),
                            Deployment(provider="p", upstream_model="real"), "messages",
                            stream=False)
    assert json.loads(sent)["model"] == "real"


def test_malformed_json_is_400() -> None:
    """A body that is not a JSON object is a 400."""
    for body in (b"{bad", b"[1, 2]"):
        with pytest.raises(BadRequest):
            parse_json(body)
