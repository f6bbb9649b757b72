"""An upstream whose ``count_tokens`` under-counts on purpose: the mock, answering counts low.

``python -m tests.e2e._undercount --port P --percent 60`` serves the mock upstream
(``gateway.mock.create_mock_app``: it bills every request exactly as before and records
it in its ledger) but answers ``POST /v1/messages/count_tokens`` with ``percent`` % of the
count it would bill (rounded down): a provider whose count is wrong, low, by that much.
The gateway then admits a Messages request on a counted bound below what the upstream
bills (docs/bounds.md, "When the provider's count is wrong").
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from gateway.mock import create_mock_app

COUNT_PATH = "/v1/messages/count_tokens"


def undercounting(app: Any, *, percent: int) -> Any:
    """``app`` with its count answers scaled to ``percent`` % (everything else as is)."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != COUNT_PATH:
            await app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        body = bytearray()

        async def hold(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return
            out = bytes(body)
            if start.get("status") == 200:
                doc = msgspec.json.decode(out)
                doc["input_tokens"] = doc["input_tokens"] * percent // 100
                out = msgspec.json.encode(doc)
            headers = [(k, v) for k, v in start.get("headers", [])
                       if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(out)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": out, "more_body": False})

        await app(scope, receive, hold)
    return wrapped


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--percent", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(undercounting(create_mock_app(), percent=args.percent), host="127.0.0.1",
                port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
