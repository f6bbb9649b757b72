"""A streamed answer's filter: text deltas held back per channel, scanned, then released.

The relay hands it the complete SSE events it would send (``StreamMeter.feed``'s output)
and sends what :meth:`StreamGuard.feed` returns. Each text delta (chat ``content`` and
tool-call ``arguments``, Responses ``output_text``/``function_call_arguments`` deltas,
Anthropic ``text``/``partial_json``/``thinking`` deltas) goes into its channel's buffer;
an event carries on only the part of its channel's buffer that is safe to release:

- all but the last ``holdback_chars`` characters, and never a cut inside a run of
  non-blank characters (an email, a key, a JWT, a placeholder) nor between the digit
  groups of a number written with spaces (a card, an IBAN, a phone), nor after the start
  of a ``-----BEGIN … PRIVATE KEY-----`` block whose end has not arrived — up to
  ``max_hold_chars``, after which the oldest text goes on regardless (scanned first);
- the released part is scanned together with the last characters already released (so a
  secret's name before its value still counts as its context), its findings acted on
  (mask; block raises :class:`GuardrailBlocked` before a byte of the match went out),
  then its pseudonyms restored.

Any other event (a choice's end, a block's stop, a ``.done`` event, ``[DONE]``) first
releases every held channel in events of the channel's own shape; the text of a
``.done`` event or a final ``response.completed`` is filtered whole, as a JSON answer is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.guardrails._guard import Guard, walk

_EVENT = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_CONTEXT = 64
"""Released characters kept as the next scan's context (not sent again)."""
_STEP = 16
"""Text is released in steps of at least this many characters (fewer rescans)."""


@dataclass
class _Channel:
    event: str | None
    template: dict[str, Any]
    setter: Any
    buf: str = ""
    context: str = ""
    path: str = ""
    sent: int = 0


def _groups(before: str, after: str) -> bool:
    """Whether a single space between ``before`` and ``after`` may join the groups of
    one value: digits to digits (a card, a phone), digits to capitals (an IBAN's
    ``GB82 WEST 1234``), ``(415) 555``, ``+33 (0)5``."""
    if before.isdigit():
        return after.isdigit() or after == "(" or (after.isascii() and after.isupper())
    return after.isdigit() and (before == ")" or (before.isascii() and before.isupper()))


def _safe_cut(buf: str, cut: int) -> int:
    """The release point at or before ``cut`` that splits no run a detector may match."""
    k = cut
    while k > 0:
        left, right = buf[k - 1], buf[k]
        if not left.isspace() and not right.isspace():
            k -= 1  # inside a run of non-blank characters
        elif left == " " and k >= 2 and _groups(buf[k - 2], right):
            k -= 1  # between the groups of a number written with spaces
        elif right == " " and k + 1 < len(buf) and _groups(left, buf[k + 1]):
            k -= 1  # the same, cut just before the space
        else:
            break
    begin = buf.rfind("-----BEGIN", 0, k)
    if begin >= 0 and "PRIVATE KEY" in buf[begin:begin + 60] and "-----END" not in buf[begin + 10:]:
        k = begin
    return k


def _frame(event: str | None, doc: dict[str, Any]) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + msgspec.json.encode(doc) + b"\n\n"


def _parse(raw: bytes) -> tuple[str | None, bytes]:
    event: str | None = None
    data: list[bytes] = []
    for line in raw.splitlines():
        if line.startswith(b"event:"):
            event = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
    return event, b"\n".join(data)


@dataclass
class StreamGuard:
    """One streamed answer's filter (see the module docstring)."""

    guard: Guard
    endpoint: str
    channels: dict[Any, _Channel] = field(default_factory=dict)
    _rest: bytes = b""

    def feed(self, data: bytes) -> bytes:
        """The events to send for ``data`` (complete events); raises GuardrailBlocked."""
        if not data:
            return data
        buf = self._rest + data
        out: list[bytes] = []
        start = 0
        for m in _EVENT.finditer(buf):
            out.append(self._event(buf[start:m.end()]))
            start = m.end()
        self._rest = buf[start:]
        return b"".join(out)

    def finish(self, tail: bytes = b"") -> bytes:
        """Whatever is left at the stream's end: the held text, released."""
        rest, self._rest = self._rest + tail, b""
        out = self.feed(rest + b"\n\n") if rest.strip() else b""
        return out + self._flush_all()

    # -- events -----------------------------------------------------------------------

    def _event(self, raw: bytes) -> bytes:
        name, data = _parse(raw)
        if not data or data == b"[DONE]":
            return self._flush_all() + raw
        try:
            doc = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return self._flush_all() + raw
        if not isinstance(doc, dict):
            return self._flush_all() + raw
        if self.endpoint == "chat":
            return self._chat(name, doc, raw)
        delta = self._delta_of(doc)
        if delta is None:
            whole = walk(doc, self.guard.answer_text)
            return self._flush_all() + (raw if whole is doc else _frame(name, whole))
        key, field_name, text, path = delta
        ch = self._channel(key, name, doc, field_name, path)
        doc = ch.setter(doc, self._release(ch, text, final=False))
        return _frame(name, doc)

    def _delta_of(self, doc: dict[str, Any]) -> tuple[Any, str, str, str] | None:
        kind = doc.get("type")
        if self.endpoint == "messages" and kind == "content_block_delta":
            delta = doc.get("delta") or {}
            for f in ("text", "partial_json", "thinking"):
                if isinstance(delta.get(f), str):
                    return ("m", doc.get("index"), f), f, delta[f], f"content[{doc.get('index')}]"
            return None
        if self.endpoint == "responses" and kind in (
                "response.output_text.delta", "response.function_call_arguments.delta",
                "response.reasoning_summary_text.delta", "response.refusal.delta"):
            text = doc.get("delta")
            if isinstance(text, str):
                return (("r", kind, doc.get("item_id"), doc.get("content_index")), "delta",
                        text, f"output[{doc.get('output_index')}]")
        return None

    def _channel(self, key: Any, name: str | None, doc: dict[str, Any], field_name: str,
                 path: str) -> _Channel:
        ch = self.channels.get(key)
        if ch is None:
            if self.endpoint == "messages":
                def setter(d: dict[str, Any], text: str) -> dict[str, Any]:
                    return {**d, "delta": {**d["delta"], field_name: text}}
            else:
                def setter(d: dict[str, Any], text: str) -> dict[str, Any]:
                    return {**d, "delta": text}
            ch = self.channels[key] = _Channel(name, doc, setter, path=path)
        ch.template = doc
        return ch

    def _chat(self, name: str | None, doc: dict[str, Any], raw: bytes) -> bytes:
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices:
            whole = walk(doc, self.guard.answer_text)
            return self._flush_all() + (raw if whole is doc else _frame(name, whole))
        pre: list[bytes] = []
        new_choices = []
        for choice in choices:
            if not isinstance(choice, dict):
                new_choices.append(choice)
                continue
            i = choice.get("index", 0)
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta = dict(delta)
                content = delta.get("content")
                if isinstance(content, str) and content:
                    ch = self._chat_channel(("c", i), doc, i, None, f"choices[{i}].content")
                    delta["content"] = self._release(ch, content, final=False)
                calls = delta.get("tool_calls")
                if isinstance(calls, list):
                    delta["tool_calls"] = [self._chat_call(doc, i, c) for c in calls]
                choice = {**choice, "delta": delta}
            if choice.get("finish_reason") is not None:
                pre += self._flush_choice(i)
            new_choices.append(choice)
        return b"".join(pre) + _frame(name, {**doc, "choices": new_choices})

    def _chat_call(self, doc: dict[str, Any], i: int, call: Any) -> Any:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
            return call
        j = call.get("index", 0)
        ch = self._chat_channel(("t", i, j), doc, i, j,
                                f"choices[{i}].tool_calls[{j}].arguments")
        return {**call, "function": {**fn, "arguments": self._release(
            ch, fn["arguments"], final=False)}}

    def _chat_channel(self, key: Any, doc: dict[str, Any], i: int, j: int | None,
                      path: str) -> _Channel:
        ch = self.channels.get(key)
        if ch is None:
            base = {k: v for k, v in doc.items() if k != "choices"}
            if j is None:
                def setter(_: dict[str, Any], text: str) -> dict[str, Any]:
                    return {**base, "choices": [{"index": i, "delta": {"content": text},
                                                 "finish_reason": None}]}
            else:
                def setter(_: dict[str, Any], text: str) -> dict[str, Any]:
                    return {**base, "choices": [{"index": i, "delta": {"tool_calls": [
                        {"index": j, "function": {"arguments": text}}]},
                        "finish_reason": None}]}
            ch = self.channels[key] = _Channel(None, doc, setter, path=path)
        return ch

    def _flush_choice(self, i: int) -> list[bytes]:
        out = []
        for key, ch in list(self.channels.items()):
            if key[1] == i and ch.buf:
                out.append(_frame(ch.event, ch.setter(ch.template,
                                                      self._release(ch, "", final=True))))
        return out

    def _flush_all(self) -> bytes:
        out = []
        for ch in self.channels.values():
            if ch.buf:
                out.append(_frame(ch.event, ch.setter(ch.template,
                                                      self._release(ch, "", final=True))))
        return b"".join(out)

    # -- the hold-back ------------------------------------------------------------------

    def _release(self, ch: _Channel, text: str, *, final: bool) -> str:
        """Add ``text`` to the channel; return the part of its buffer safe to send."""
        buf = ch.buf + text
        policy = self.guard.policy
        if final:
            k = len(buf)
        else:
            k = _safe_cut(buf, len(buf) - policy.holdback) if len(buf) > policy.holdback else 0
            if len(buf) - k > policy.max_hold:
                k = len(buf) - policy.holdback
        if k <= 0 or (k < _STEP and ch.sent and not final):  # the first text: at once
            ch.buf = buf
            return ""
        # Scan what is held too: a match that starts before the cut moves the cut back.
        ctx = ch.context
        found = self.guard._findings(ctx + buf, "answer") if policy.answers else []
        for f in found:
            if f.start < len(ctx) + k < f.end:
                k = max(0, f.start - len(ctx))
        head = [f for f in found if f.start >= len(ctx) and f.end <= len(ctx) + k]
        shifted = [type(f)(f.detector, f.kind, f.start - len(ctx), f.end - len(ctx))
                   for f in head]
        out = self.guard._apply(buf[:k], ch.path, "answer", shifted, ch.sent)
        out = self.guard.restore(out)
        ch.context = (ctx + buf[:k])[-_CONTEXT:]
        ch.buf = buf[k:]
        ch.sent += k
        return out
