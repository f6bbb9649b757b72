"""A lease refusal says which one it is in both shapes (issue 25), with real processes:
inferplaned on Postgres, one ``mayu serve`` plane, the real openai and anthropic SDKs.

``lease_expired`` (the control plane is away) must be told from ``lease_exhausted``
(retry in a second) without reading the message: OpenAI's ``error.code``, Anthropic's
``error.details.error_code`` (the SDK's ``error_code``).
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.e2e import _lease
from tests.e2e._lease import MODEL, LeaseStack, budget_doc, chat, wait_until

pytestmark = pytest.mark.e2e


stack = _lease.lease_stack  # the fixture, under this module's name


def test_an_expired_lease_is_lease_expired_in_both_shapes(stack: LeaseStack) -> None:
    """inferplaned gone past lease expiry: a FailClosed cap answers 503 lease_expired as
    OpenAI's error.code and Anthropic's error_code, retryable with its Retry-After."""
    stack.publish(budget_doc("closed", "team-closed", limit_milli=10_000, grant_milli=5))
    stack.add_plane("p1", teams=["team-closed"])
    url, key = stack.planes["p1"].url, stack.keys[("p1", "team-closed")]
    wait_until(lambda: chat(url, key).status_code == 200, what="first lease granted")
    stack.stop_control()
    wait_until(lambda: chat(url, key).status_code == 503, what="FailClosed gated")
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as oerr:
        oa.chat.completions.create(model=MODEL, max_tokens=50,
                                   messages=[{"role": "user", "content": "hello there"}])
    assert oerr.value.status_code == 503 and oerr.value.code == "lease_expired"
    an = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as aerr:
        an.messages.create(model=MODEL, max_tokens=50,
                           messages=[{"role": "user", "content": "hello there"}])
    assert aerr.value.status_code == 503 and aerr.value.error_code == "lease_expired"
    for headers in (oerr.value.response.headers, aerr.value.response.headers):
        assert headers["x-should-retry"] == "true" and int(headers["retry-after"]) >= 1
