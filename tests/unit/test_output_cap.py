"""The operator's opt-in output cap (``default_output_tokens``, issue 26): written into a
chat-completions or Responses request that names no output limit, the output bound is the
cap; a client's own limit is never touched. The property checks the capped bound against
what an upstream that honours the forwarded limit (the mock's reading of it) can bill.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import Deployment, ModelSettings, Settings, load_settings
from gateway.errors import ConfigError
from gateway.governance import Bounds
from gateway.ingress._attempt import Attempt, Call, capped
from gateway.ingress._bounds import choices, input_bound, input_classes
from gateway.ingress._prepare import names_output_limit, output_bound, output_cap
from gateway.mock._model import LIMIT_FIELDS, openai_classes, output_limit
from gateway.pricing import ModelPrice, Usage, cost_bound_micro_usd, cost_micro_usd
from gateway.usage import Endpoint

CEILING = Settings().server.max_output_tokens
_caps = st.one_of(st.none(), st.integers(1, 8192))


@st.composite
def _request(draw: st.DrawFn) -> tuple[Endpoint, dict[str, Any]]:
    """A chat-completions, Responses, Messages or embeddings body, with or without a
    client limit (any of the fields the gateway reads), ``n`` choices for chat."""
    endpoint: Endpoint = draw(st.sampled_from(["chat", "responses", "messages",
                                               "embeddings"]))
    text = draw(st.text(max_size=200))
    doc: dict[str, Any] = (
        {"model": "m", "input": text} if endpoint in ("responses", "embeddings")
        else {"model": "m", "messages": [{"role": "user", "content": text}]})
    if endpoint != "embeddings" and draw(st.booleans()):
        doc[draw(st.sampled_from(LIMIT_FIELDS))] = draw(st.integers(0, 8192))
    if endpoint == "chat" and draw(st.booleans()):
        doc["n"] = draw(st.integers(1, 4))
    return endpoint, doc


def _model(model_cap: int | None, deployment_cap: int | None) -> ModelSettings:
    return ModelSettings(name="m", max_output_tokens=8192, default_output_tokens=model_cap,
                         deployments=[Deployment(provider="p",
                                                 default_output_tokens=deployment_cap)])


def _upstream_output(doc: dict[str, Any], endpoint: Endpoint, model: ModelSettings,
                     wanted: int) -> int:
    """The most output an upstream that honours the forwarded limit bills: ``wanted``
    tokens per choice, stopped at the limit as the mock reads it, else at the model's
    ceiling; times ``n``."""
    if endpoint == "embeddings":
        return 0
    per_choice = min(wanted, output_limit(doc) if names_output_limit(doc)
                     else model.max_output_tokens)
    return per_choice * (doc.get("n") or 1)


@given(_request(), _caps, _caps, st.integers(0, 20_000),
       st.integers(0, 10_000_000).map(lambda q: ModelPrice(input=q, output=8 * q,
                                                            cache_read=q // 10)))
def test_the_capped_bound_covers_what_the_upstream_bills(
        request: tuple[Endpoint, dict[str, Any]], model_cap: int | None,
        deployment_cap: int | None, wanted: int, price: ModelPrice) -> None:
    """For any request and any model/deployment cap: the forwarded body keeps a client's
    limit as sent and otherwise carries the cap (chat and Responses only), the capped
    bound is never above the uncapped one, and no usage an upstream honouring the
    forwarded limit can bill — the mock's own usage included — costs more than it."""
    endpoint, doc = request
    model = _model(model_cap, deployment_cap)
    cap = output_cap(model, model.deployments[0])
    assert cap == (deployment_cap if deployment_cap is not None else model_cap)
    written = capped(doc, endpoint, cap)
    forwarded = doc if written is None else written[0]
    if written is not None:
        assert msgspec.json.decode(written[1]) == forwarded
    named = names_output_limit(doc)
    if named or cap is None or endpoint in ("messages", "embeddings"):
        assert forwarded == doc  # the client's limit (or lack of one) untouched
    else:
        field = "max_output_tokens" if endpoint == "responses" else "max_completion_tokens"
        assert forwarded == {**doc, field: cap}
    before = output_bound(doc, endpoint, model, ceiling=CEILING)
    out = output_bound(forwarded, endpoint, model, ceiling=CEILING)
    assert out <= before
    body = msgspec.json.encode(forwarded)
    inp = input_bound(body, forwarded, model)
    bound = cost_bound_micro_usd(inp, out, price, input_classes=input_classes(forwarded))
    billed = _upstream_output(forwarded, endpoint, model, wanted)
    assert billed <= out
    assert cost_micro_usd(Usage(input=inp, output=billed), price) <= bound
    if endpoint in ("chat", "responses"):
        mock = openai_classes(forwarded)
        assert mock.output <= output_limit(forwarded)
        usage = Usage(input=mock.input, cache_read=mock.cache_read,
                      output=mock.output * (forwarded.get("n") or 1))
        assert cost_micro_usd(usage, price) <= bound


def _call(doc: dict[str, Any], endpoint: Endpoint, model: ModelSettings,
          deployments: list[Deployment]) -> Call:
    body = msgspec.json.encode(doc)
    bounds = Bounds(input_tokens=input_bound(body, doc, model),
                    output_tokens=output_bound(doc, endpoint, model, ceiling=CEILING),
                    price=model.price, input_classes=input_classes(doc),
                    choices=choices(doc, endpoint))
    gw = SimpleNamespace(settings=Settings())
    return Call(gw=gw, principal=None, endpoint=endpoint,  # type: ignore[arg-type]
                model=model, doc=doc, body=body, stream=False, bounds=bounds,
                client_headers={}, deployments=[])


PRICE = ModelPrice(input=1_250_000, output=10_000_000, cache_read=125_000)


def _headers(call: Call, deployment: Deployment) -> dict[str, str]:
    attempt = Attempt(call=call, deployment=deployment, provider=None,  # type: ignore[arg-type]
                      index=0)
    return attempt.headers()


def test_an_attempt_writes_its_deployments_cap_and_a_fallback_takes_its_own() -> None:
    """The first deployment's cap is written and announced; a fallback to a deployment
    with another cap writes that one; to one with the cap off, the client's body and the
    model's ceiling come back (no header)."""
    a = Deployment(provider="a", default_output_tokens=2048)
    b = Deployment(provider="b")
    c = Deployment(provider="c", default_output_tokens=512)
    model = ModelSettings(name="m", deployments=[a, b, c], price=PRICE,
                          max_output_tokens=128_000, default_output_tokens=4096)
    doc = {"model": "m", "input": "hello", "stream": True}
    call = _call(doc, "responses", model, [a, b, c])
    assert call.bounds.output_tokens == 128_000
    for deployment, cap in ((a, 2048), (b, 4096), (c, 512)):
        call = call.capped_for(deployment)
        assert call.output_cap == cap and call.bounds.output_tokens == cap
        assert msgspec.json.decode(call.body) == {**doc, "max_output_tokens": cap}
        assert call.usd_bound == call.bounds.usd_of(cap)
        assert _headers(call, deployment)["x-inferplane-output-cap"] == str(cap)
    off = msgspec.structs.replace(model, default_output_tokens=None)
    call = msgspec.structs.replace(call, model=off).capped_for(b)
    assert call.output_cap is None and call.bounds.output_tokens == 128_000
    assert call.body == call.client_body and call.doc == doc
    assert "x-inferplane-output-cap" not in _headers(call, b)


@pytest.mark.parametrize("limit", ["max_completion_tokens", "max_tokens"])
def test_a_client_limit_is_kept_whether_smaller_or_larger(limit: str) -> None:
    """A chat request that names its own limit is forwarded as sent and bounded by it,
    above or below the cap; no cap is announced."""
    model = ModelSettings(name="m", deployments=[Deployment(provider="p")], price=PRICE,
                          max_output_tokens=128_000, default_output_tokens=4096)
    for asked in (100, 50_000):
        doc = {"model": "m", limit: asked, "n": 2,
               "messages": [{"role": "user", "content": "hi"}]}
        call = _call(doc, "chat", model, model.deployments)
        call = call.capped_for(model.deployments[0])
        assert call.output_cap is None and call.bounds.output_tokens == 2 * asked
        assert call.body == msgspec.json.encode(doc)
        assert "x-inferplane-output-cap" not in _headers(call, model.deployments[0])


def test_budget_fit_below_the_cap_is_kept_on_a_fallback() -> None:
    """When budget fit lowered the limit below the cap, a fallback with a larger cap (or
    none) keeps the fitted limit; one with a smaller cap lowers it further."""
    big = Deployment(provider="big", default_output_tokens=8192)
    small = Deployment(provider="small", default_output_tokens=256)
    model = ModelSettings(name="m", deployments=[big, small], price=PRICE,
                          max_output_tokens=128_000, default_output_tokens=4096)
    doc = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    call = _call(doc, "chat", model, [big, small])
    # a deployment without its own cap: the model's
    call = call.capped_for(Deployment(provider="x"))
    assert call.bounds.output_tokens == 4096
    call = call.fitted_to(1000, "max_tokens lowered from 4096 to 1000")
    fitted = {**doc, "max_completion_tokens": 1000}
    assert call.doc == fitted and call.bounds.output_tokens == 1000
    call = call.capped_for(big)
    assert call.bounds.output_tokens == 1000 and call.doc == fitted and call.output_cap == 8192
    call = call.capped_for(small)
    assert call.bounds.output_tokens == 256 and call.doc["max_completion_tokens"] == 256


@pytest.mark.parametrize(("where", "cap", "message"), [
    ("model", 0, r"models\[0\]\.default_output_tokens"),
    ("model", 9000, r"models\[0\]\.default_output_tokens: 9000 is above the model's "
                    r"max_output_tokens \(8192\)"),
    ("deployment", 9000, r"models\[0\]\.deployments\[0\]\.default_output_tokens: 9000"),
    ("deployment", "many", r"models\[0\]\.deployments\[0\]\.default_output_tokens"),
    ("server", 4096, r"models\[0\]\.default_output_tokens: 4096 is above "
                     r"server\.max_output_tokens \(1000\)"),
])
def test_a_bad_cap_is_refused_at_startup_naming_its_key(
        tmp_path: Path, where: str, cap: Any, message: str) -> None:
    """A cap that is not a positive token count, above the model's max_output_tokens or
    above server.max_output_tokens stops startup naming the key."""
    deployment: dict[str, Any] = {"provider": "p"}
    model: dict[str, Any] = {"name": "m", "max_output_tokens": 8192,
                             "deployments": [deployment]}
    config: dict[str, Any] = {"providers": [{"name": "p", "kind": "mock"}],
                              "models": [model]}
    if where == "deployment":
        deployment["default_output_tokens"] = cap
    else:
        model["default_output_tokens"] = cap
    if where == "server":
        config["server"] = {"max_output_tokens": 1000}
    path = tmp_path / "mayu.yaml"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message):
        load_settings(path)


def test_the_cap_is_off_by_default() -> None:
    """Without the setting nothing is capped: today's behaviour."""
    model = ModelSettings(name="m", deployments=[Deployment(provider="p")])
    assert output_cap(model, model.deployments[0]) is None
    assert capped({"model": "m", "input": "x"}, "responses", None) is None
