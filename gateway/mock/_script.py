"""The mock upstream with scripted answers and a ledger of the bodies it received.

``python -m gateway.mock._script --port P`` serves :func:`gateway.mock.create_mock_app`
wrapped by :func:`scripted`:

- ``POST /__mock/script`` queues one answer: ``{"text": "…", "n": 3}`` (the text in
  ``n`` streamed deltas cut by characters, so a value or a placeholder can be split
  across chunks; or ``"parts": ["…", "…"]`` for exact deltas), optionally ``"tool":
  {"name": "…", "arguments": "…", "n": 2}`` (a tool call whose arguments stream in
  ``n`` deltas). In ``text`` and ``arguments``, ``{echo}`` is replaced by the text of the
  request's last user message (its last block) as the upstream received it. The next
  generation request (chat, Responses or Messages; JSON or streamed) takes the oldest
  queued answer, in its protocol's own shape with its usage; requests with an empty
  queue go to the mock.
- ``GET /__mock/bodies`` lists every generation request body received (as text, the
  embeddings' too), in order; ``DELETE /__mock/bodies`` clears it and the queue.
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import msgspec

from gateway.mock import _model as m
from gateway.mock._wire import _message_item, _output_text, _response_doc, _sse
from gateway.usage import Endpoint, text_strings

_PATHS: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/responses": "responses",
                               "/v1/messages": "messages"}
_ids = itertools.count(1)


class Script:
    """The queued answers and the bodies received."""

    def __init__(self) -> None:
        self.queue: list[dict[str, Any]] = []
        self.bodies: list[str] = []


def split(text: str, n: int) -> list[str]:
    """``text`` in ``n`` pieces cut by characters (the last may be shorter)."""
    if not text:
        return [""]
    size = -(-len(text) // max(1, n))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _echo(body: dict[str, Any]) -> str:
    """The text of the request's last user message (of its last content block, when it
    has blocks: where an agent puts the user's prompt, after its reminders)."""
    for field in ("messages", "input"):
        value = body.get(field)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value:
            users = [v for v in value if isinstance(v, dict) and v.get("role") == "user"]
            last = (users or value)[-1]
            content = last.get("content", last) if isinstance(last, dict) else last
            if isinstance(content, list) and content:
                content = content[-1]
            return " ".join(text_strings(content))
    return ""


def _parts(spec: dict[str, Any], text: str) -> list[str]:
    parts = spec.get("parts")
    if isinstance(parts, list):
        return [str(p) for p in parts]
    return split(text, int(spec.get("n", 1)))


def answer(endpoint: Endpoint, body: dict[str, Any], spec: dict[str, Any]
           ) -> tuple[str, bytes | list[bytes]]:
    """(content type, the JSON body or the SSE events) of a scripted answer."""
    echo = _echo(body)
    text = str(spec.get("text", "")).replace("{echo}", echo)
    if isinstance(spec.get("parts"), list):
        text = "".join(spec["parts"])
    tool = spec.get("tool")
    args = str(tool.get("arguments", "{}")).replace("{echo}", echo) if tool else ""
    usage_in = max(1, len(msgspec.json.encode(body)) // 8)
    usage_out = min(max(1, (len(text) + len(args)) // 4), m.output_limit(body))
    n = next(_ids)
    build = {"chat": _chat, "responses": _responses, "messages": _messages}[endpoint]
    stream = bool(body.get("stream"))
    out = build(n, str(body.get("model", "mock")), text, _parts(spec, text), tool, args,
                split(args, int(tool.get("n", 1))) if tool else [], usage_in, usage_out,
                stream, body)
    return ("text/event-stream" if stream else "application/json"), out


def _chat(n: int, model: str, text: str, parts: list[str], tool: Any, args: str,
          arg_parts: list[str], usage_in: int, usage_out: int, stream: bool,
          body: dict[str, Any]) -> bytes | list[bytes]:
    usage = {"prompt_tokens": usage_in, "completion_tokens": usage_out,
             "total_tokens": usage_in + usage_out}
    base = {"id": f"chatcmpl-script-{n}", "created": int(time.time()), "model": model}
    call = {"id": f"call_{n}", "type": "function",
            "function": {"name": tool["name"], "arguments": args}} if tool else None
    finish = "tool_calls" if tool else "stop"
    if not stream:
        message: dict[str, Any] = {"role": "assistant", "content": text or None,
                                   "refusal": None}
        if call:
            message["tool_calls"] = [call]
        return msgspec.json.encode({**base, "object": "chat.completion", "usage": usage,
                                    "choices": [{"index": 0, "finish_reason": finish,
                                                 "logprobs": None, "message": message}]})
    chunk = {**base, "object": "chat.completion.chunk"}

    def ev(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return _sse({**chunk, "choices": [{"index": 0, "delta": delta,
                                           "finish_reason": finish_reason}]})
    events = [ev({"role": "assistant", "content": ""})]
    events += [ev({"content": p}) for p in parts if p]
    if call:
        events.append(ev({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                          "function": {"name": tool["name"],
                                                       "arguments": ""}}]}))
        events += [ev({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
                   for p in arg_parts if p]
    events.append(ev({}, finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append(_sse({**chunk, "choices": [], "usage": usage}))
    events.append(_sse(b"[DONE]"))
    return events


def _responses(n: int, model: str, text: str, parts: list[str], tool: Any, args: str,
               arg_parts: list[str], usage_in: int, usage_out: int, stream: bool,
               body: dict[str, Any]) -> bytes | list[bytes]:
    usage = {"input_tokens": usage_in, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": usage_out, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": usage_in + usage_out}
    final = _response_doc(n, model, text, "completed", usage)
    fc = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
          "name": tool["name"], "arguments": args, "status": "completed"} if tool else None
    if fc:
        final["output"].append(fc)
    if not stream:
        return msgspec.json.encode(final)
    seq = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        return _sse({"type": kind, "sequence_number": next(seq), **fields}, kind)
    item = {"item_id": f"msg_mock_{n}", "output_index": 0, "content_index": 0}
    opening = _response_doc(n, model, "", "in_progress", None)
    lifecycle: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": opening}),
        ("response.in_progress", {"response": opening}),
        ("response.output_item.added", {"output_index": 0,
                                        "item": _message_item(n, "", "in_progress")}),
        ("response.content_part.added", {**item, "part": _output_text("")})]
    events = [event(kind, **fields) for kind, fields in lifecycle]
    events += [event("response.output_text.delta", **item, delta=p, logprobs=[])
               for p in parts if p]
    events += [event("response.output_text.done", **item, text=text, logprobs=[]),
               event("response.content_part.done", **item, part=_output_text(text)),
               event("response.output_item.done", output_index=0,
                     item=_message_item(n, text, "completed"))]
    if fc:
        events.append(event("response.output_item.added", output_index=1,
                            item={**fc, "arguments": "", "status": "in_progress"}))
        events += [event("response.function_call_arguments.delta", item_id=fc["id"],
                         output_index=1, delta=p) for p in arg_parts if p]
        events += [event("response.function_call_arguments.done", item_id=fc["id"],
                         output_index=1, arguments=args),
                   event("response.output_item.done", output_index=1, item=fc)]
    events.append(event("response.completed", response=final))
    return events


def _messages(n: int, model: str, text: str, parts: list[str], tool: Any, args: str,
              arg_parts: list[str], usage_in: int, usage_out: int, stream: bool,
              body: dict[str, Any]) -> bytes | list[bytes]:
    usage = {"input_tokens": usage_in, "output_tokens": usage_out,
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    use = {"type": "tool_use", "id": f"toolu_{n}", "name": tool["name"]} if tool else None
    if use:
        content.append({**use, "input": msgspec.json.decode(args or "{}")})
    msg = {"id": f"msg_script_{n}", "type": "message", "role": "assistant", "model": model,
           "stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None,
           "content": content}
    if not stream:
        return msgspec.json.encode({**msg, "usage": usage})
    start = {**msg, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events = [_sse({"type": "message_start", "message": start}, "message_start")]
    index = 0
    if text:
        events.append(_sse({"type": "content_block_start", "index": 0, "content_block": {
            "type": "text", "text": ""}}, "content_block_start"))
        events += [_sse({"type": "content_block_delta", "index": 0, "delta": {
            "type": "text_delta", "text": p}}, "content_block_delta") for p in parts if p]
        events.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        index = 1
    if use:
        events.append(_sse({"type": "content_block_start", "index": index, "content_block": {
            **use, "input": {}}}, "content_block_start"))
        events += [_sse({"type": "content_block_delta", "index": index, "delta": {
            "type": "input_json_delta", "partial_json": p}}, "content_block_delta")
            for p in arg_parts if p]
        events.append(_sse({"type": "content_block_stop", "index": index},
                           "content_block_stop"))
    events.append(_sse({"type": "message_delta", "delta": {
        "stop_reason": msg["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": usage_out}}, "message_delta"))
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return events


async def _read(receive: Any) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        body.extend(message.get("body", b""))
        if not message.get("more_body"):
            return bytes(body)


async def _send_json(send: Any, status: int, data: bytes,
                     content_type: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def scripted(app: Any, script: Script | None = None) -> Any:
    """``app`` (the mock) answering queued scripts and recording bodies (module doc)."""
    state = script or Script()

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        path, method = scope.get("path"), scope.get("method")
        if scope["type"] != "http":
            await app(scope, receive, send)
        elif path == "/__mock/script" and method == "POST":
            state.queue.append(msgspec.json.decode(await _read(receive)))
            await _send_json(send, 200, b'{"queued": %d}' % len(state.queue))
        elif path == "/__mock/bodies" and method in ("GET", "DELETE"):
            if method == "DELETE":
                state.bodies.clear()
                state.queue.clear()
            await _send_json(send, 200, msgspec.json.encode(state.bodies))
        elif (path in _PATHS or path == "/v1/embeddings") and method == "POST":
            raw = await _read(receive)
            state.bodies.append(raw.decode("utf-8", "replace"))
            if not state.queue or path not in _PATHS:
                await app(scope, _replay(raw, receive), send)
                return
            kind, out = answer(_PATHS[path], msgspec.json.decode(raw), state.queue.pop(0))
            if isinstance(out, bytes):
                await _send_json(send, 200, out)
                return
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache")]})
            for event in out:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await app(scope, receive, send)
    return wrapped


def _replay(raw: bytes, then: Any) -> Any:
    """The body already read, then the client's own messages (its disconnect)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await then()  # type: ignore[no-any-return]
    return receive


def main() -> None:
    import uvicorn

    from gateway.mock import create_mock_app

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(scripted(create_mock_app()), host="127.0.0.1", port=args.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
