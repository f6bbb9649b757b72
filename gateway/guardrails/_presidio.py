"""The Presidio plug-in: Microsoft Presidio's analyzer as one more request detector.

Optional (``pip install 'inferplane[presidio]'``) and never on by default: Presidio costs
tens of milliseconds per KB where the built-in detectors cost a fraction of one
(docs/guardrails.md has the figures). Configured by ``guardrails.presidio``; nothing of
Presidio or spaCy is imported until a configured gateway screens its first request.

After the built-in detectors have acted (so Presidio sees their placeholders, never a
value they masked), every text field of a guarded request is analysed in a worker
thread, off the event loop, within ``timeout_s``. Each result at or above
``score_threshold`` is a finding of the detector ``presidio_<entity>`` (the entity type
lower-cased), acted on by :meth:`Guard.act` exactly like a built-in's: monitor, mask
(``[PRESIDIO_CREDIT_CARD]``), pseudonymize (restored in the answer) or block. An analysis
that fails or runs out of time is ``failure: open`` (the request goes on, screened by the
built-ins only; logged, counted) or ``closed`` (503 ``guardrail_unavailable``, nothing
admitted). Only the entity type and offsets are logged, never the text.

``model: blank`` runs Presidio over an empty spaCy pipeline (``spacy.blank``): its pattern
recognizers (cards with Luhn, IBANs, emails, phones, IPs, crypto wallets, US SSNs, ...)
work, its NER-based ones (PERSON, LOCATION, ...) find nothing. Any other ``model`` is an
installed spaCy pipeline package, loaded with ``spacy.load``; the gateway never downloads
one (Presidio's own loader would).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from gateway.guardrails._detect import Finding
from gateway.guardrails._guard import Guard, detector_name, walk
from gateway.guardrails._settings import GuardrailPresidio
from gateway.guardrails._webhook import GuardrailUnavailable

log = logging.getLogger("mayu.guardrails")

INSTALL = "pip install 'inferplane[presidio]'"

_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="presidio")
"""Analyses run here: at most two at once (spaCy is CPU-bound, and a timed-out analysis
cannot be interrupted: a small pool keeps late ones from piling up threads)."""

_ENGINES: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


def check_installed(model: str) -> None:
    """ValueError unless the extra, and ``model`` when it is not ``blank``, are installed
    (found without importing them: the config is checked at startup, cheaply)."""
    if importlib.util.find_spec("presidio_analyzer") is None:
        raise ValueError(f"the Presidio plug-in is not installed: {INSTALL}")
    if model != "blank" and importlib.util.find_spec(model.replace("-", "_")) is None:
        raise ValueError(f"the spaCy model package {model!r} is not installed (install it "
                         f"in the gateway's environment, or use model: blank)")


def engine(model: str, language: str) -> Any:
    """The AnalyzerEngine for ``(model, language)``, built once per process."""
    key = (model, language)
    with _LOCK:
        hit = _ENGINES.get(key)
        if hit is None:
            hit = _ENGINES[key] = _build(model, language)
        return hit


def _build(model: str, language: str) -> Any:
    import spacy
    import tldextract
    # Presidio's email recognizer asks tldextract, whose default extractor fetches the
    # Public Suffix List from the Internet on first use (and caches it under ~/.cache):
    # a gateway reaches only its providers, so the list bundled with tldextract is used.
    tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(
        suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import SpacyNlpEngine

    class _Loaded(SpacyNlpEngine):
        """spaCy's pipeline loaded here, never downloaded (SpacyNlpEngine.load would)."""

        def load(self) -> None:
            nlp = (spacy.blank(language) if model == "blank"
                   else spacy.load(model.replace("-", "_")))
            self.nlp = {language: nlp}  # type: ignore[assignment]  # typed None in 2.2

    nlp_engine = _Loaded(models=[{"lang_code": language, "model_name": model}])
    nlp_engine.load()
    return AnalyzerEngine(nlp_engine=nlp_engine, supported_languages=[language])


def analyze(conf: GuardrailPresidio, texts: list[str]) -> list[list[Finding]]:
    """Each text's findings: at or above the threshold, non-overlapping (the higher
    score wins), in text order. Blocking: runs in a worker thread."""
    entities = [e for e in conf.entities if conf.actions.get(e, conf.action) != "off"]
    if not entities:
        return [[] for _ in texts]
    analyzer = engine(conf.model, conf.language)
    out: list[list[Finding]] = []
    for text in texts:
        results = analyzer.analyze(text=text, language=conf.language, entities=entities,
                                   score_threshold=conf.score_threshold)
        results.sort(key=lambda r: (-r.score, r.start))
        kept: list[Finding] = []
        for r in results:
            if r.end > r.start and all(r.end <= k.start or r.start >= k.end for k in kept):
                kept.append(Finding(detector_name(r.entity_type), "pii", r.start, r.end))
        kept.sort(key=lambda f: f.start)
        out.append(kept)
    return out


async def screen_presidio(conf: GuardrailPresidio, guard: Guard, doc: dict[str, Any],
                          body: bytes) -> tuple[dict[str, Any], bytes]:
    """``(doc, body)`` with Presidio's findings acted on (raises GuardrailBlocked, or
    GuardrailUnavailable when the analysis fails and ``failure`` is closed)."""
    texts: list[str] = []

    def collect(text: str, path: str) -> str:
        texts.append(text)
        return text
    walk(doc, collect)
    if not texts:
        return doc, body
    if (conf.model, conf.language) not in _ENGINES:
        await warm(conf)  # once per process: a model's load is not the analysis' time
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    try:
        found = await asyncio.wait_for(
            loop.run_in_executor(_EXECUTOR, analyze, conf, texts), conf.timeout_s)
    except Exception as exc:  # noqa: BLE001 — any failure is the operator's `failure`
        why = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
        outcome = "failed_open" if conf.failure == "open" else "failed_closed"
        _observe(guard, outcome, started)
        log.warning("request %s: Presidio analysis %s (%s)", guard.request_id,
                    outcome.replace("_", " "), why)
        if conf.failure == "closed":
            raise GuardrailUnavailable() from None
        return doc, body
    _observe(guard, "ok", started)
    at = iter(found)

    def act(text: str, path: str) -> str:
        return guard.act(text, path, next(at))
    new = walk(doc, act)
    return (doc, body) if new is doc else (new, msgspec.json.encode(new))


def _observe(guard: Guard, outcome: str, started: float) -> None:
    if guard.metrics is not None:
        guard.metrics.presidio.labels(outcome).observe(time.perf_counter() - started)


async def warm(conf: GuardrailPresidio) -> None:
    """Build the engine ahead of the first request (loading spaCy takes seconds)."""
    await asyncio.get_running_loop().run_in_executor(_EXECUTOR, engine, conf.model,
                                                     conf.language)
