"""The Presidio plug-in (gateway/guardrails/_presidio.py): real presidio-analyzer, in-process.

``model: blank`` (spaCy's empty English pipeline; no NER model is on PyPI from its
authors): Presidio's pattern recognizers find planted cards, IBANs and emails, acted on
through the same guard path as the built-in detectors (mask, block, pseudonymize), off
the event loop, within a timeout whose failure is the operator's ``failure`` setting.
The first test loads spaCy and Presidio (a few seconds); the engine is kept per process.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import ConfigError
from gateway.guardrails import (
    DETECTORS,
    GuardrailBlocked,
    GuardrailSettings,
    GuardrailUnavailable,
    _presidio,
    guard_request,
    scan,
    stream_filter,
    warm_presidio,
)

CARD = "4111 1111 1111 1111"  # Luhn-valid (Visa's test number)
IBAN = "GB82 WEST 1234 5698 7654 32"  # mod-97 valid
EMAIL = "jane.doe@example.org"
PLANTED = (CARD, IBAN, EMAIL)

BUILTINS_OFF = {"card": "off", "iban": "off", "email": "off", "phone": "off", "ip": "off"}
"""So what is found in these tests is Presidio's finding, not a built-in's."""

PROSE = """\
The quarterly review went well. We shipped the new onboarding flow two weeks early, and
the support queue shrank by a third once the billing page explained proration clearly.
Next quarter we want to rework the search index: the current one rebuilds nightly and
takes about forty minutes, which is too slow for the catalogue teams. Marta suggested an
incremental build keyed on the last modified time; the risk is drift between replicas,
so we will add a weekly full rebuild as a safety net. Please read the design note before
Thursday's meeting and bring questions about the migration order and the rollback plan.

def retry(fn, attempts=3, backoff=0.5):
    for i in range(attempts):
        try:
            return fn()
        except TimeoutError:
            time.sleep(backoff * 2 ** i)
    raise RuntimeError("gave up after %d attempts" % attempts)

The cache hit ratio sits at 0.93 on version 4.2.1 and we expect 0.95 after the change;
latency p99 dropped from 180 ms to 120 ms in the canary, with 12 of 16 pods upgraded.
"""


def _settings(**presidio: Any) -> GuardrailSettings:
    conf = {"model": "blank", "failure": "closed", **presidio}
    return msgspec.convert({"enabled": True, "actions": BUILTINS_OFF, "presidio": conf},
                           GuardrailSettings)


def _doc(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [{"type": "text", "text": text}]}]}


async def _guard(settings: GuardrailSettings, doc: dict[str, Any],
                 registry: CollectorRegistry | None = None) -> Any:
    return await guard_request(settings, "team", (), doc, msgspec.json.encode(doc),
                               endpoint="chat", request_id="req-1", registry=registry)


def _planted_text() -> str:
    return (f"Hi, please refund my card {CARD} and wire the rest to {IBAN}; "
            f"send the receipt to {EMAIL}. Thanks!")


async def test_planted_card_iban_email_are_masked() -> None:
    """Presidio finds a planted card, IBAN and email; each goes upstream as a typed
    placeholder, and its latency is observed in the metric."""
    registry = CollectorRegistry()
    doc, body, guard = await _guard(_settings(), _doc(_planted_text()), registry)
    for value in PLANTED:
        assert value not in body.decode()
    text = doc["messages"][1]["content"][0]["text"]
    for label in ("[PRESIDIO_CREDIT_CARD]", "[PRESIDIO_IBAN_CODE]",
                  "[PRESIDIO_EMAIL_ADDRESS]"):
        assert label in text
    assert guard.findings == 3
    assert registry.get_sample_value("mayu_guardrails_presidio_seconds_count",
                                     {"outcome": "ok"}) == 1
    assert registry.get_sample_value(
        "mayu_guardrails_detected_total",
        {"detector": "presidio_credit_card", "action": "mask", "direction": "request"}) == 1


async def test_block_names_the_detector_never_the_value() -> None:
    """A ``block`` entity refuses the request with the client's error naming
    ``presidio_credit_card``, and nothing of the card in the error or the log."""
    settings = _settings(actions={"CREDIT_CARD": "block"})
    with pytest.raises(GuardrailBlocked) as caught:
        await _guard(settings, _doc(_planted_text()))
    assert caught.value.detector == "presidio_credit_card"
    assert CARD not in str(caught.value) and "4111" not in str(caught.value)


async def test_pseudonymized_value_is_restored_in_the_answer() -> None:
    """``pseudonymize``: a numbered placeholder goes upstream, the answer gets the
    original back (the mapping lives in the request's guard)."""
    settings = _settings(action="pseudonymize")
    doc, body, guard = await _guard(settings, _doc(_planted_text()))
    assert EMAIL not in body.decode() and CARD not in body.decode()
    text = doc["messages"][1]["content"][0]["text"]
    assert "[PRESIDIO_EMAIL_ADDRESS_" in text
    answer = msgspec.json.encode({"choices": [{"message": {
        "role": "assistant", "content": "Receipt goes to [PRESIDIO_EMAIL_ADDRESS_3]."}}]})
    restored = msgspec.json.decode(guard.answer_json(answer))
    assert restored["choices"][0]["message"]["content"] == f"Receipt goes to {EMAIL}."


async def test_pseudonym_split_across_stream_chunks_is_restored() -> None:
    """A streamed answer whose Presidio placeholder is cut across three chunks reaches
    the client with the original value, never the placeholder."""
    _, _, guard = await _guard(_settings(action="pseudonymize"), _doc(_planted_text()))
    pieces = ["Receipt to [PRESIDIO_EMA", "IL_ADDRE", "SS_3] today."]
    sg = stream_filter(guard, "chat")
    assert sg is not None
    out = b""
    for piece in pieces:
        delta = {"choices": [{"index": 0, "delta": {"content": piece}}]}
        out += sg.feed(b"data: " + msgspec.json.encode(delta) + b"\n\n")
    out += sg.finish(b"data: [DONE]\n\n")
    text = "".join(msgspec.json.decode(line[6:])["choices"][0]["delta"].get("content", "")
                   for line in out.split(b"\n") if line.startswith(b"data: {"))
    assert text == f"Receipt to {EMAIL} today."


async def test_monitor_logs_the_entity_and_offsets_only(
        caplog: pytest.LogCaptureFixture) -> None:
    """``monitor`` forwards the text unchanged and logs detector and position, never
    the matched text."""
    caplog.set_level(logging.DEBUG)
    text = _planted_text()
    doc, _, guard = await _guard(_settings(action="monitor"), _doc(text))
    assert doc["messages"][1]["content"][0]["text"] == text
    assert guard.findings == 3
    logged = caplog.text
    assert "presidio_iban_code monitor request" in logged
    for value in PLANTED:
        assert value not in logged and value.replace(" ", "") not in logged


async def test_ordinary_prose_and_code_have_no_finding() -> None:
    """A paragraph of prose and a function of code: no finding at the 0.5 threshold."""
    found = await asyncio.to_thread(_presidio.analyze, _settings().presidio, [PROSE])
    assert found == [[]]


async def test_timeout_is_the_operators_failure_setting() -> None:
    """An analysis that outlasts ``timeout_s`` refuses the request (``closed``: 503
    guardrail_unavailable) or lets it through unscreened by Presidio (``open``), and
    the event loop is never held meanwhile."""
    release = threading.Event()
    real = _presidio.analyze

    def stuck(conf: Any, texts: list[str]) -> Any:
        release.wait(10)
        return real(conf, texts)

    text = _planted_text()
    await asyncio.to_thread(_presidio.engine, "blank", "en")  # loaded: not timed here
    _presidio.analyze = stuck  # type: ignore[assignment]
    try:
        registry = CollectorRegistry()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        task = asyncio.create_task(ticker())
        with pytest.raises(GuardrailUnavailable):
            await _guard(_settings(timeout_s=0.3), _doc(text), registry)
        doc, _, _ = await _guard(_settings(timeout_s=0.3, failure="open"), _doc(text),
                                 registry)
        task.cancel()
        assert doc["messages"][1]["content"][0]["text"] == text
        assert ticks >= 10  # the loop ran while two analyses were stuck in their thread
        for outcome in ("failed_closed", "failed_open"):
            assert registry.get_sample_value("mayu_guardrails_presidio_seconds_count",
                                             {"outcome": outcome}) == 1
    finally:
        _presidio.analyze = real  # type: ignore[assignment]
        release.set()


def test_config_errors_name_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model package that is not installed, or the extra missing, fails at startup
    naming ``guardrails.presidio`` (and, for the extra, the pip command)."""
    from gateway.config import load_settings
    path = tmp_path / "mayu.yaml"
    path.write_text("guardrails:\n  enabled: true\n  presidio:\n"
                    "    model: en_core_web_nonesuch\n    failure: open\n")
    with pytest.raises(ConfigError, match=r"guardrails\.presidio: .*en_core_web_nonesuch"):
        load_settings(path)
    path.write_text("guardrails:\n  presidio: {model: blank, failure: open,\n"
                    "    actions: {PERSON: block}, entities: [CREDIT_CARD]}\n")
    with pytest.raises(ConfigError, match=r"guardrails\.presidio: .*'PERSON'"):
        load_settings(path)
    real = _presidio.importlib.util.find_spec
    monkeypatch.setattr(_presidio.importlib.util, "find_spec",
                        lambda name, *a: None if name == "presidio_analyzer" else real(name))
    path.write_text("guardrails:\n  presidio: {model: blank, failure: open}\n")
    with pytest.raises(ConfigError, match=r"guardrails\.presidio: .*"
                       r"pip install 'inferplane\[presidio\]'"):
        load_settings(path)


def test_cost_per_kb_against_the_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    """Presidio and the built-in detectors on the same ~8 KB (prose with planted values):
    both find the planted card; the ms per KB of each is printed (docs/guardrails.md)."""
    text = ((PROSE + _planted_text() + "\n") * 8)
    kb = len(text.encode()) / 1024
    conf = _settings().presidio
    assert conf is not None
    _presidio.engine("blank", "en")  # the model's load is not the analysis' cost
    _presidio.analyze(conf, [text])  # warm
    runs = 5
    t0 = time.perf_counter()
    for _ in range(runs):
        found = _presidio.analyze(conf, [text])[0]
    presidio_ms = (time.perf_counter() - t0) * 1000 / runs / kb
    t0 = time.perf_counter()
    for _ in range(runs * 20):
        builtin = scan(text, DETECTORS)
    builtin_ms = (time.perf_counter() - t0) * 1000 / (runs * 20) / kb
    assert sum(f.detector == "presidio_credit_card" for f in found) == 8
    assert sum(f.detector == "card" for f in builtin) == 8
    with capsys.disabled():
        print(f"\npresidio (model: blank): {presidio_ms:.2f} ms/KB; built-in detectors: "
              f"{builtin_ms:.3f} ms/KB; on {kb:.1f} KB")


async def test_a_model_that_does_not_load_fails_startup_naming_the_key() -> None:
    """A ``model`` that is installed but is no spaCy pipeline passes the config check
    and fails the startup load (``warm_presidio``) as a ConfigError naming the key."""
    settings = _settings(model="msgspec")  # importable, so found; not a spaCy package
    assert settings.presidio is not None
    with pytest.raises(ConfigError, match=r"^guardrails\.presidio: cannot load the model "
                                          r"'msgspec'"):
        await warm_presidio(settings.presidio)


async def test_docs_presidio_block_loads_and_acts(tmp_path: Path) -> None:
    """docs/guardrails.md's Presidio config block loads as written: a card is blocked
    (``actions: {CREDIT_CARD: block}``), an email masked (``action: mask``)."""
    from gateway.config import load_settings
    page = (Path(__file__).resolve().parents[2] / "docs" / "guardrails.md").read_text()
    block = page.split("## Presidio", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "mayu.yaml"
    path.write_text(block)
    settings = load_settings(path).guardrails
    assert settings.presidio is not None and settings.presidio.model == "blank"
    settings = msgspec.structs.replace(settings, actions=BUILTINS_OFF)
    with pytest.raises(GuardrailBlocked, match="presidio_credit_card"):
        await _guard(settings, _doc(_planted_text()))
    doc, _, _ = await _guard(settings, _doc(f"write to {EMAIL}"))
    assert doc["messages"][1]["content"][0]["text"] == "write to [PRESIDIO_EMAIL_ADDRESS]"


def _pipeline_package(root: Path, name: str) -> None:
    """An installed spaCy pipeline package named ``name`` under ``root`` (a dist-info,
    so ``spacy.load`` finds it as pip would have put it): a blank English pipeline with
    an entity ruler that tags one person and one city, standing in for a NER model."""
    import spacy
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "PERSON", "pattern": "Alice Martin"},
                        {"label": "GPE", "pattern": "Lyon"}])
    pkg = root / name
    pkg.mkdir()
    nlp.to_disk(pkg / f"{name}-0.0.0")
    (pkg / "meta.json").write_text(msgspec.json.encode(
        {"lang": "en", "name": name.removeprefix("en_"), "version": "0.0.0"}).decode())
    (pkg / "__init__.py").write_text(
        "from spacy.util import load_model_from_init_py\n\n\n"
        "def load(**overrides):\n    return load_model_from_init_py(__file__, **overrides)\n")
    info = root / f"{name}-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")


async def test_an_installed_pipeline_package_finds_person_and_location(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model: <package>`` loads an installed spaCy pipeline (here one whose entity
    ruler stands in for a NER model): PERSON pseudonymized and LOCATION masked, which
    ``model: blank`` never finds."""
    _pipeline_package(tmp_path, "en_inferplane_ruler")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = "Alice Martin flies to Lyon on Monday."
    actions = {"PERSON": "pseudonymize", "LOCATION": "mask"}
    blank, _, _ = await _guard(_settings(actions=actions), _doc(text))
    assert blank["messages"][1]["content"][0]["text"] == text
    settings = _settings(model="en_inferplane_ruler", actions=actions)
    assert settings.presidio is not None
    await warm_presidio(settings.presidio)
    doc, _, guard = await _guard(settings, _doc(text))
    sent = doc["messages"][1]["content"][0]["text"]
    assert sent == "[PRESIDIO_PERSON_1] flies to [PRESIDIO_LOCATION] on Monday."
    assert guard.restore(sent) == "Alice Martin flies to [PRESIDIO_LOCATION] on Monday."
