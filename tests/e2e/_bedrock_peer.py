"""A Bedrock-shaped test upstream, strict where Bedrock is: a real process.

``python tests/e2e/_bedrock_peer.py --port P --sts-port S [--key ID:SECRET ...]`` serves

- ``POST /model/{modelId}/invoke`` and ``/invoke-with-response-stream`` as Bedrock's
  runtime does for Claude: every request's SigV4 signature is verified with botocore's
  signer against the credentials this process issued (``--key`` pairs, and every session
  the STS beside it handed out, with its session token and expiry). A missing, wrong,
  foreign-scoped or expired signature is Bedrock's 403 (``{"message"}`` and
  ``x-amzn-ErrorType``); a body with ``model``/``stream`` or without
  ``anthropic_version: bedrock-2023-05-31`` is a ``ValidationException``. The answer is
  the mock model's (``gateway.mock``: same arithmetic, cache classes included), as JSON
  or in the AWS event-stream framing with ``amazon-bedrock-invocationMetrics`` on
  ``message_stop``. Model ids select behaviours as the mock's flags do (``cut-stream``,
  ``slow-stream``; ``drawn-out`` spreads a stream over ``--drawn-out-s``);
  ``throttle`` answers ``ThrottlingException``, ``notready`` ``ModelNotReadyException``,
  ``stream-exception`` sends an exception message mid-stream.
  A tool loop: when the last message's text asks ``READ:<path>`` and carries no tool
  result yet, the answer is a ``Read`` tool call for that path (``stop_reason:
  tool_use``), so an agent runs the tool and sends its result back; the answer to the
  result is the mock's text.
- STS (``AssumeRole``, ``AssumeRoleWithWebIdentity``) from moto's server, in this
  process, on ``--sts-port``, so the peer reads the sessions moto issued directly.
- ``POST /model/{modelId}/count-tokens`` (``CountTokens``, foundation-model ids only),
  counting as the mock bills; ``GET /__peer/counts`` says how many it answered.
- ``GET``/``DELETE /__peer/ledger``: the usage it reported, one entry per answer, with
  the calling session's name (what CloudTrail would show); ``GET /__peer/refusals``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import hmac
import re
import sys
from pathlib import Path
from typing import Any

import msgspec
import uvicorn
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.mock import MockStreamCut, PromptCache, plan_count, plan_reply, play  # noqa: E402
from gateway.providers import chunk_message, exception_message  # noqa: E402

_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,"
                   r"\s*SignedHeaders=([^,]+),\s*Signature=([0-9a-f]{64})$")
_PATH = re.compile(r"^/model/([^/]+)/(invoke|invoke-with-response-stream|count-tokens)$")
_PROFILE = re.compile(r"^(?:us|eu|apac|jp|au|ca|us-gov|global)\.")
_SKEW = datetime.timedelta(minutes=5)
_READ = re.compile(r"READ:(\S+)")


class Refused(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class Peer:
    def __init__(self, keys: dict[str, str], region: str, drawn_out_s: float) -> None:
        self.keys = keys
        self.drawn_out_s = drawn_out_s
        self.region = region
        self.ledger: list[dict[str, Any]] = []
        self.refusals: list[dict[str, str]] = []
        self.counts = 0
        self.cache: PromptCache | None = None
        """``--prompt-cache``: this region's server cache (``gateway.mock._cache``)."""

    def _issued(self, key_id: str) -> tuple[str, str | None, datetime.datetime | None, str]:
        """(secret, session token, expiry, session name) of a credential we issued."""
        if key_id in self.keys:
            return self.keys[key_id], None, None, "static"
        from moto.sts.models import sts_backends
        for regions in list(sts_backends.values()):
            for backend in list(regions.values()):
                role = backend.get_assumed_role_from_access_key(key_id)
                if role is not None:
                    return (role.secret_access_key, role.session_token, role.expiration,
                            role.session_name)
        raise Refused(403, "UnrecognizedClientException",
                      "The security token included in the request is invalid.")

    def issued(self) -> list[str]:
        """Every secret this process issued or accepts (secret keys, session tokens)."""
        from moto.sts.models import sts_backends
        found = list(self.keys.values())
        for regions in list(sts_backends.values()):
            for backend in list(regions.values()):
                found += [v for role in backend.assumed_roles
                          for v in (role.secret_access_key, role.session_token)]
        return found

    def verify(self, scope: dict[str, Any], headers: dict[str, str],
               body: bytes) -> tuple[str, str]:
        """(session name, access key id) of a correctly signed request; Refused
        otherwise."""
        match = _AUTH.match(headers.get("authorization", ""))
        if match is None:
            raise Refused(403, "MissingAuthenticationTokenException",
                          "Missing Authentication Token")
        key_id, day, region, service, signed, signature = match.groups()
        if (region, service) != (self.region, "bedrock"):
            raise Refused(403, "InvalidSignatureException",
                          f"Credential should be scoped to a valid region and service "
                          f"({self.region}/bedrock), not {region}/{service}.")
        secret, token, expiry, session = self._issued(key_id)
        if token is not None and not hmac.compare_digest(
                headers.get("x-amz-security-token", ""), token):
            raise Refused(403, "UnrecognizedClientException",
                          "The security token included in the request is invalid.")
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        if expiry is not None and now >= expiry:
            raise Refused(403, "ExpiredTokenException",
                          "The security token included in the request is expired")
        stamp = headers.get("x-amz-date", "")
        try:
            when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ")
        except ValueError:
            raise Refused(403, "InvalidSignatureException", "X-Amz-Date is missing") from None
        if abs(when - now) > _SKEW or not stamp.startswith(day):
            raise Refused(403, "InvalidSignatureException", "Signature expired")
        names = signed.split(";")
        if "host" not in names:
            raise Refused(403, "InvalidSignatureException", "host must be signed")
        request = AWSRequest(method=scope["method"],
                             url=f"http://{headers['host']}{scope['raw_path'].decode()}",
                             data=body, headers={n: headers.get(n, "") for n in names})
        request.context["timestamp"] = stamp
        signer = SigV4Auth(Credentials(key_id, secret, token), service, region)
        canonical = signer.canonical_request(request)
        expected = signer.signature(signer.string_to_sign(request, canonical), request)
        if not hmac.compare_digest(expected, signature):
            # As AWS words it: the canonical request it computed, signed headers (a
            # session token among them) included.
            raise Refused(403, "InvalidSignatureException",
                          "The request signature we calculated does not match the "
                          "signature you provided. Check your AWS Secret Access Key and "
                          "signing method.\n\nThe Canonical String for this request should "
                          f"have been\n'{canonical}'\n")
        return session, key_id


def _check_body(body: bytes) -> dict[str, Any]:
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise Refused(400, "ValidationException", "Malformed input request") from None
    if not isinstance(doc, dict):
        raise Refused(400, "ValidationException", "Malformed input request")
    for extra in ("model", "stream"):
        if extra in doc:
            raise Refused(400, "ValidationException", "Malformed input request: "
                          f"#: extraneous key [{extra}] is not permitted, please reformat "
                          "your input and try again.")
    if doc.get("anthropic_version") != "bedrock-2023-05-31":
        raise Refused(400, "ValidationException",
                      "Malformed input request: #: required key [anthropic_version] "
                      "not found (bedrock-2023-05-31)")
    beta = doc.get("anthropic_beta")
    if beta is not None and not (isinstance(beta, list)
                                 and all(isinstance(b, str) for b in beta)):
        raise Refused(400, "ValidationException", "anthropic_beta: an array of strings")
    return doc


async def _read(receive: Any) -> bytes:
    parts = []
    while True:
        event = await receive()
        parts.append(event.get("body", b""))
        if not event.get("more_body"):
            return b"".join(parts)


async def _send_json(send: Any, status: int, doc: Any, headers: list[tuple[bytes, bytes]]
                     ) -> None:
    body = msgspec.json.encode(doc)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def _read_request(doc: dict[str, Any]) -> str | None:
    """The path a ``READ:<path>`` asks for, when the last message is the user's text
    (not yet a tool result)."""
    messages = doc.get("messages") or []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    content = last.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    if last.get("role") != "user" or any(isinstance(b, dict) and b.get("type") ==
                                         "tool_result" for b in blocks):
        return None
    for block in blocks:
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            found = _READ.search(block["text"])
            if found:
                return found.group(1)
    return None


def _has_tool_result(doc: dict[str, Any]) -> bool:
    messages = doc.get("messages") or []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    content = last.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _tool_events(events: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    """The mock's events with its text block replaced by a ``Read`` tool call."""
    start, *_, delta, stop = events
    args = msgspec.json.encode({"file_path": path}).decode()
    call = {"type": "tool_use", "id": f"toolu_peer_{start['message']['id']}",
            "name": "Read", "input": {}}
    delta = {**delta, "delta": {**delta["delta"], "stop_reason": "tool_use"}}
    return [start, {"type": "content_block_start", "index": 0, "content_block": call},
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "input_json_delta", "partial_json": args[:10]}},
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "input_json_delta", "partial_json": args[10:]}},
            {"type": "content_block_stop", "index": 0}, delta, stop]


def _metrics(entry: dict[str, Any]) -> dict[str, int]:
    c = entry.get("classes") or {}
    return {"inputTokenCount": c.get("input", 0), "outputTokenCount": c.get("output", 0),
            "invocationLatency": 1, "firstByteLatency": 1,
            "cacheReadInputTokenCount": c.get("cache_read", 0),
            "cacheWriteInputTokenCount": c.get("cache_write_5m", 0)
            + c.get("cache_write_1h", 0)}


def create_app(peer: Peer) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/readyz":
            await _send_json(send, 200, {"status": "ready"}, [])
        elif path == "/__peer/ledger":
            if method == "DELETE":
                peer.ledger.clear()
                peer.refusals.clear()
            await _send_json(send, 200, peer.ledger, [])
        elif path == "/__peer/refusals":
            await _send_json(send, 200, peer.refusals, [])
        elif path == "/__peer/counts":
            await _send_json(send, 200, {"counts": peer.counts}, [])
        elif path == "/__peer/issued":  # for the tests' grep for leaked secrets
            await _send_json(send, 200, peer.issued(), [])
        else:
            await invoke(scope, receive, send)

    def count_tokens(model: str, body: bytes) -> dict[str, int]:
        """CountTokens: the InvokeModel body under input.invokeModel.body (base64), for
        a foundation model id (a profile is refused as Bedrock refuses it)."""
        if _PROFILE.match(model):
            raise Refused(400, "ValidationException",
                          "The provided model doesn't support counting tokens.")
        try:
            wrapped = msgspec.json.decode(body)["input"]["invokeModel"]["body"]
            invoke = base64.b64decode(wrapped, validate=True)
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            raise Refused(400, "ValidationException", "input.invokeModel.body: required "
                          "(base64 of an InvokeModel body)") from None
        doc = _check_body(invoke)
        if not isinstance(doc.get("max_tokens"), int):
            raise Refused(400, "ValidationException", "required key [max_tokens] not found")
        answer = plan_count({k: v for k, v in doc.items() if k not in (
            "anthropic_version", "anthropic_beta", "max_tokens")} | {"model": model})
        peer.counts += 1
        return {"inputTokens": msgspec.json.decode(answer.body or b"{}")["input_tokens"]}

    async def invoke(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        body = await _read(receive)
        match = _PATH.match(scope["path"])
        try:
            if scope["method"] != "POST" or match is None:
                raise Refused(404, "UnknownOperationException", "Unknown operation")
            session, key_id = peer.verify(scope, headers, body)
            if match.group(2) == "count-tokens":
                await _send_json(send, 200, count_tokens(match.group(1), body), [])
                return
            doc = _check_body(body)
        except Refused as exc:
            peer.refusals.append({"kind": exc.kind, "path": scope["path"]})
            await _send_json(send, exc.status, {"message": exc.message},
                             [(b"x-amzn-errortype", f"{exc.kind}:http://internal.amazon.com/"
                               "coral/com.amazon.bedrock/".encode())])
            return
        model, operation = match.group(1), match.group(2)
        if "throttle" in model or "notready" in model:
            kind = "ThrottlingException" if "throttle" in model else "ModelNotReadyException"
            await _send_json(send, 429, {"message": "Too many requests, please wait."},
                             [(b"x-amzn-errortype", kind.encode())])
            return
        stream = operation == "invoke-with-response-stream"
        reply = plan_reply("messages", {**doc, "model": model, "stream": stream},
                           bill=peer.cache.classes if peer.cache else None)

        path = _read_request(doc)

        def record(entry: dict[str, Any]) -> None:
            peer.ledger.append({**entry, "session": session, "key_id": key_id,
                                "tool_call": path, "tool_result": _has_tool_result(doc),
                                "anthropic_beta": doc.get("anthropic_beta")})
        if not stream or reply.status != 200:
            if reply.entry is not None and reply.status == 200:
                record(reply.entry)
            answer = msgspec.json.decode(reply.body or b"{}")
            if path and reply.status == 200:
                answer.update(stop_reason="tool_use", content=[{
                    "type": "tool_use", "id": f"toolu_peer_{answer['id']}", "name": "Read",
                    "input": {"file_path": path}}])
            await _send_json(send, reply.status, answer, [])
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/vnd.amazon.eventstream"),
                                (b"x-amzn-requestid", b"peer-request")]})
        if path:
            events = [msgspec.json.decode(e.split(b"data: ", 1)[1]) for e in reply.events]
            reply.events = [b"data: " + msgspec.json.encode(e) + b"\n\n"
                            for e in _tool_events(events, path)]
            reply.usage_at = len(reply.events) - 2
        try:
            spread = peer.drawn_out_s / len(reply.events) if "drawn-out" in model else 0.0
            async for sse in play(reply, latency_s=spread, record=record):
                data = sse.split(b"data: ", 1)[1].rstrip(b"\n")
                event = msgspec.json.decode(data)
                if event.get("type") == "message_stop" and reply.entry is not None:
                    event["amazon-bedrock-invocationMetrics"] = _metrics(reply.entry)
                if event.get("type") == "content_block_stop" and "stream-exception" in model:
                    await send({"type": "http.response.body", "more_body": True,
                                "body": exception_message("modelStreamErrorException",
                                                          "The model stream failed")})
                    break
                await send({"type": "http.response.body", "more_body": True,
                            "body": chunk_message(msgspec.json.encode(event))})
        except MockStreamCut:
            raise RuntimeError("cut-stream: the connection breaks mid-stream") from None
        await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sts-port", type=int, required=True)
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--drawn-out-s", type=float, default=24.0)
    parser.add_argument("--prompt-cache", action="store_true",
                        help="bill by a prompt cache kept in this process (one region's)")
    parser.add_argument("--key", action="append", default=[],
                        help="ID:SECRET of a static credential this peer accepts")
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer
    sts = ThreadedMotoServer(ip_address="127.0.0.1", port=args.sts_port, verbose=False)
    sts.start()
    keys = dict(k.split(":", 1) for k in args.key)
    peer = Peer(keys, args.region, args.drawn_out_s)
    peer.cache = PromptCache() if args.prompt_cache else None
    asyncio.run(uvicorn.Server(uvicorn.Config(create_app(peer), host="127.0.0.1",
                                              port=args.port, log_level="warning")).serve())


if __name__ == "__main__":
    main()
