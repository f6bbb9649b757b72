"""The alert webhook URL is a secret (a Slack hook's token is its path): never logged.

A real :class:`WebhookSender` POSTs to a real HTTP receiver on 127.0.0.1 with logging at
INFO, the level a gateway runs at, and every log record the delivery produced (httpx's
own ``HTTP Request: POST …`` line included) is checked for the URL's path.
"""

from __future__ import annotations

import logging
import socket

import pytest

from gateway.alerts import WebhookSender
from tests.webhook import WebhookReceiver

TOKEN = "T0AAA0AAA/B0BBB0BBB/XsecretXsecretXsecret"


async def test_deliveries_log_scheme_and_host_only(caplog: pytest.LogCaptureFixture) -> None:
    """A delivery that lands and one that fails log the webhook as scheme://host:port/…
    only; the path (the token) and query appear in no log record nor in the error; the
    log filter is gone once the sender is closed."""
    caplog.set_level(logging.INFO)
    before = list(logging.getLogger("httpx").filters)
    with WebhookReceiver() as hook:
        port = hook.url.split(":")[2].split("/")[0]
        url = f"http://127.0.0.1:{port}/services/{TOKEN}?sig={TOKEN[-8:]}"
        sender = WebhookSender(url, secret="k", retries=0)
        await sender.start()
        try:
            delivery = await sender.deliver(b"{}", event_id="e1")
        finally:
            await sender.close()
        assert delivery.ok and len(hook.wait_for(1)) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"POST http://127.0.0.1:{port}/…" in m for m in messages), messages
    assert sender.shown_url == f"http://127.0.0.1:{port}/…"

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    nowhere = WebhookSender(f"http://127.0.0.1:{dead}/services/{TOKEN}", secret="k",
                            retries=0, timeout_s=2)
    await nowhere.start()
    try:
        failed = await nowhere.deliver(b"{}", event_id="e2")
    finally:
        await nowhere.close()
    assert not failed.ok and failed.error is not None and TOKEN not in failed.error

    everything = "\n".join(messages + [r.getMessage() for r in caplog.records])
    for part in TOKEN.split("/"):
        assert part not in everything
    assert logging.getLogger("httpx").filters == before
