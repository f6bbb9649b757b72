"""A fast fake OpenAI upstream for the speed bench (a script, not a test).

Raw asyncio protocol (uvloop when installed) parsing with httptools: it answers every
``POST .../chat/completions`` with one fixed chat completion carrying its usage, or —
when the body asks for ``"stream":true`` — with an SSE stream of ``--events`` content
chunks (``max_tokens`` of them when it asks for more than 1000: the long-stream memory
check), the usage-only chunk (OpenAI's ``include_usage`` shape) and ``[DONE]``, each
event its own HTTP chunk, with a loop turn between events so they leave as separate
writes. It costs a few tens of µs of CPU per request, so in a bench on two shared cores
the upstream takes little of the CPU the gateway (or LiteLLM) is measured with.

    python tests/bench/_fastup.py --port 8001 [--events 8]

Prints ``ready`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys

import httptools

_BODY = (b'{"id":"chatcmpl-bench","object":"chat.completion","created":0,'
         b'"model":"mock-gpt","choices":[{"index":0,"message":{"role":"assistant",'
         b'"content":"A short answer from the fake upstream."},"finish_reason":"stop"}],'
         b'"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}')
_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
         b"content-length: %d\r\n\r\n" % len(_BODY))
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
             b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _events(n: int) -> list[bytes]:
    pre = b'{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,' \
          b'"model":"mock-gpt","choices":['
    out = [b"data: " + pre + b'{"index":0,"delta":{"role":"assistant","content":""},'
           b'"finish_reason":null}]}\n\n']
    out += [b"data: " + pre + b'{"index":0,"delta":{"content":"word%d "},'
            b'"finish_reason":null}]}\n\n' % i for i in range(n)]
    out.append(b"data: " + pre + b'{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
    out.append(b"data: " + pre + b'],"usage":{"prompt_tokens":12,"completion_tokens":%d,'
               b'"total_tokens":%d}}\n\n' % (n, n + 12))
    out.append(b"data: [DONE]\n\n")
    return [_chunk(e) for e in out] + [b"0\r\n\r\n"]


_MAX_TOKENS = re.compile(rb'"max_tokens":\s*(\d+)')
_LONG = 1000
"""A stream asking for more ``max_tokens`` than this gets that many content events (the
speed bench's long-stream memory check); any other gets ``--events``."""


class _Upstream(asyncio.Protocol):
    events: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.t.close()

    def on_message_begin(self) -> None:
        self.body = []

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        if b'"stream":true' in body or b'"stream": true' in body:
            asked = _MAX_TOKENS.search(body)
            n = int(asked.group(1)) if asked else 0
            asyncio.ensure_future(self._stream(_events(n) if n > _LONG else self.events))
        else:
            self.t.write(_HEAD + _BODY)

    async def _stream(self, events: list[bytes]) -> None:
        self.t.write(_SSE_HEAD)
        for event in events:
            await asyncio.sleep(0)
            if self.t.is_closing():
                return
            self.t.write(event)


async def _main(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port,
                                                            backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--events", type=int, default=8, help="content chunks per stream")
    args = ap.parse_args()
    _Upstream.events = _events(args.events)
    try:
        import uvloop
    except ImportError:
        asyncio.run(_main(args.port))
    else:
        uvloop.run(_main(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
