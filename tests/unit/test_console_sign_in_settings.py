"""The console's sign-in settings and its failed-sign-in window, without I/O: how many
failures an address may make and when it may try again, and that ``server.console`` and
``server.trusted_proxies`` refuse bad values naming their key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import load_settings
from gateway.console._throttle import SignInThrottle
from gateway.errors import ConfigError
from gateway.server import uvicorn_config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_held_after_its_failures_until_the_oldest_leaves_the_window() -> None:
    """Three failures in 60 s: the fourth attempt waits until the first is 60 s old;
    another address is not held; a failure outside the window no longer counts."""
    clock = Clock()
    throttle = SignInThrottle(failures=3, window_s=60.0, clock=clock)
    for step in range(3):
        assert throttle.retry_after("a") is None
        assert throttle.failed("a") == step + 1
        clock.now += 10
    assert throttle.retry_after("a") == 30
    assert throttle.retry_after("b") is None
    clock.now += 29.5
    assert throttle.retry_after("a") == 1
    clock.now += 0.5
    assert throttle.retry_after("a") is None
    assert throttle.failed("a") == 3  # the first left the window: two and this one


def test_the_window_forgets_the_least_recently_refused_address_past_its_bound() -> None:
    """At most ``max_addresses`` addresses are kept (memory is bounded)."""
    throttle = SignInThrottle(failures=1, window_s=60.0, max_addresses=2, clock=Clock())
    for address in ("a", "b", "c"):
        throttle.failed(address)
    assert throttle.retry_after("a") is None
    assert throttle.retry_after("b") is not None and throttle.retry_after("c") is not None


def _refused(tmp_path: Path, server: dict[str, object]) -> str:
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump({"server": server}))
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    return info.value.message


@pytest.mark.parametrize(("server", "key"), [
    ({"trusted_proxies": ["10.0.0.0/33"]}, "server.trusted_proxies[0]"),
    ({"trusted_proxies": ["127.0.0.1", "proxy.example"]}, "server.trusted_proxies[1]"),
    ({"console": {"session_idle_s": 0}}, "server.console.session_idle_s"),
    ({"console": {"session_max_s": 90000}}, "server.console.session_max_s"),
    ({"console": {"secure_cookie": "sometimes"}}, "server.console.secure_cookie"),
    ({"console": {"sign_in_failures": 0}}, "server.console.sign_in_failures")])
def test_a_bad_console_or_proxy_setting_is_refused_naming_its_key(
        tmp_path: Path, server: dict[str, object], key: str) -> None:
    """A malformed address or network, a zero or day-long expiry, an unknown cookie
    mode, no failure allowed: each refused at load, naming its key."""
    assert key in _refused(tmp_path, server)


def test_uvicorn_believes_forwarded_headers_only_from_the_configured_proxies(
        tmp_path: Path) -> None:
    """``mayu serve``'s uvicorn configuration trusts exactly server.trusted_proxies
    (none by default, not uvicorn's own 127.0.0.1 nor FORWARDED_ALLOW_IPS)."""
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump({"server": {"trusted_proxies": ["10.0.0.0/8"]}}))
    configured = uvicorn_config(object(), load_settings(path).server, log_level="warning")
    assert configured.proxy_headers and configured.forwarded_allow_ips == ["10.0.0.0/8"]
    default = uvicorn_config(object(), load_settings(None).server, log_level="warning")
    assert default.forwarded_allow_ips == []
