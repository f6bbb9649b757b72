"""The mock model: a deterministic fake LLM for both protocols (demos, tests, benches).

In-process it backs the ``mock`` provider kind; over HTTP it is ``mayu mock-upstream``.
"""

from gateway.mock._cache import PromptCache
from gateway.mock._model import (
    FLAGS,
    Classes,
    anthropic_classes,
    anthropic_count,
    openai_classes,
)
from gateway.mock._server import create_mock_app
from gateway.mock._wire import MockReply, MockStreamCut, plan_count, plan_reply, play

__all__ = [
    "FLAGS",
    "Classes",
    "MockReply",
    "MockStreamCut",
    "PromptCache",
    "anthropic_classes",
    "anthropic_count",
    "create_mock_app",
    "openai_classes",
    "plan_count",
    "plan_reply",
    "play",
]
