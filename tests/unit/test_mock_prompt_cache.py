"""The mock upstream's prompt cache bills reads and writes as a server cache does."""

from __future__ import annotations

from typing import Any

from gateway.mock._cache import PromptCache


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _turns(n: int, *, ttl: str | None = None) -> dict[str, Any]:
    """A Claude-Code-shaped body: a cached system prompt, ``n`` user/assistant turns,
    the breakpoint on the last user turn."""
    control: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    messages: list[dict[str, Any]] = []
    for i in range(n):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"q{i} " * 200}]})
        if i < n - 1:
            messages.append({"role": "assistant", "content": f"a{i} " * 100})
    messages[-1]["content"][0]["cache_control"] = control
    return {"model": "mock-claude", "max_tokens": 64,
            "system": [{"type": "text", "text": "sys " * 1000, "cache_control": control}],
            "messages": messages}


def test_first_turn_writes_the_next_reads_the_prefix_it_wrote() -> None:
    """Turn 1 writes its whole prefix; turn 2 reads turn 1's prefix and writes only the
    new segment."""
    cache = PromptCache(clock=Clock())
    first = cache.classes(_turns(1))
    assert first.cache_read == 0 and first.cache_write_5m > 1000
    second = cache.classes(_turns(2))
    assert second.cache_read == first.cache_write_5m
    assert 0 < second.cache_write_5m < second.cache_read


def test_an_entry_expires_after_its_ttl_unless_read() -> None:
    """A 5-minute entry is gone after 300 s; a 1-hour one is still read then."""
    clock = Clock()
    cache = PromptCache(clock=clock)
    cache.classes(_turns(1))
    clock.t += 301
    assert cache.classes(_turns(1)).cache_read == 0
    hour = PromptCache(clock=clock)
    wrote = hour.classes(_turns(1, ttl="1h"))
    assert wrote.cache_write_1h > 0 and wrote.cache_write_5m == 0
    clock.t += 301
    assert hour.classes(_turns(1, ttl="1h")).cache_read == wrote.cache_write_1h


def test_another_deployment_is_cold_and_classes_stay_within_the_prompt() -> None:
    """Each cache is its own deployment's: a warm prefix elsewhere is a write here; the
    classes always sum to the stateless mock's prompt."""
    warm, cold = PromptCache(clock=Clock()), PromptCache(clock=Clock())
    warm.classes(_turns(3))
    hit, miss = warm.classes(_turns(3)), cold.classes(_turns(3))
    assert hit.cache_write_5m == 0 and miss.cache_read == 0
    total = [c.input + c.cache_read + c.cache_write_5m + c.cache_write_1h for c in (hit, miss)]
    assert total[0] == total[1] > 0


def test_a_body_without_breakpoints_is_all_input() -> None:
    """No ``cache_control``: nothing read or written."""
    c = PromptCache(clock=Clock()).classes(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi " * 50}]})
    assert c.cache_read == c.cache_write_5m == c.cache_write_1h == 0 and c.input > 0
