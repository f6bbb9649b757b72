"""Usage, Operations and a request's drill-down in a real headless Chromium (Debian's,
driven by Playwright) against a real ``mayu serve`` (local profile, the in-process
mock provider), with requests made by the real ``openai`` and ``anthropic`` SDKs.

Usage's chart is checked against the API: the µUSD of every drawn segment, summed per
model, equals ``/admin/v1/requests/summary``, and their total ``/v1/usage``'s team day.
A stream cut before its usage (the mock's ``cut-stream``) leaves an uncertain permit:
an operator settles it from Operations at an exact cost; a read token finds no action
there and its forged POST changes nothing. Screenshots: ``usage.png``,
``usage-compare.png``, ``operations.png``, ``request.png`` beside the other console
shots (tests/e2e/test_console_browser.py, whose browser fixtures this reuses).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.e2e._procs import Proc, start_gateway
from tests.e2e.test_console_browser import (
    PRICE,
    READ,
    WRITE,
    api,
    browser,
    page,
    shots,
    sign_in,
)

pytestmark = pytest.mark.e2e
__all__ = ["browser", "page", "shots"]  # the fixtures, shared with test_console_browser
CUT = "gpt-cut-stream"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """``mayu serve`` with a write and a read token, an OpenAI-style and an
    Anthropic-style model and one whose streams the mock cuts before their usage."""
    work = tmp_path_factory.mktemp("console-ops")
    models = [{"name": n, "price": PRICE, "deployments": [{"provider": "in-process"}]}
              for n in ("gpt-local", "claude-local", CUT)]
    config = {"data_dir": str(work / "data"), "demo": False,
              "server": {"admin_tokens": [
                  {"name": "ops", "token_ref": "env:CONSOLE_E2E_WRITE", "access": "write"},
                  {"name": "finance", "token_ref": "env:CONSOLE_E2E_READ",
                   "access": "read"}]},
              "providers": [{"name": "in-process", "kind": "mock"}], "models": models}
    path = work / "mayu.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = start_gateway(path, env={"CONSOLE_E2E_WRITE": WRITE, "CONSOLE_E2E_READ": READ})
    yield proc
    proc.stop()


def _post(gateway: Proc, path: str, body: Any) -> Any:
    r = httpx.post(f"{gateway.url}{path}", json=body,
                   headers={"Authorization": f"Bearer {WRITE}"})
    assert r.status_code in (200, 201), r.text
    return r.json()


@pytest.fixture(scope="module")
def spent(gateway: Proc) -> dict[str, Any]:
    """Team research ($100 a day), key of user bo: 2 openai SDK calls, 2 anthropic SDK calls and one
    cut stream (uncertain); team ops, one openai call (for the comparison)."""
    out: dict[str, Any] = {}
    for team, user in (("research", "bo"), ("ops", "cy")):
        _post(gateway, "/admin/v1/teams", {"name": team,
                                           "limits": {"usd_micros_per_day": 100_000_000}})
        out[team] = _post(gateway, "/admin/v1/keys", {"team": team, "user": user})["secret"]
    oa = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=out["research"], max_retries=0)
    an = anthropic.Anthropic(base_url=gateway.url, api_key=out["research"], max_retries=0)
    for n in range(2):
        oa.chat.completions.create(model="gpt-local", max_tokens=16,
                                   messages=[{"role": "user", "content": f"hello {n}"}])
        answer = an.messages.create(model="claude-local", max_tokens=16,
                                    messages=[{"role": "user", "content": f"hi {n}"}])
        assert answer.content
    with pytest.raises(openai.APIError):
        for _ in oa.chat.completions.create(model=CUT, max_tokens=16, stream=True,
                                            messages=[{"role": "user", "content": "cut"}]):
            pass
    openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=out["ops"], max_retries=0
                  ).chat.completions.create(model="gpt-local", max_tokens=16,
                                            messages=[{"role": "user", "content": "x"}])
    return out


def _drawn(figure: Any) -> dict[str, int]:
    """µUSD per series of one chart, read from its SVG rects."""
    totals: dict[str, int] = {}
    for rect in figure.locator("rect[data-series]").all():
        series = rect.get_attribute("data-series") or ""
        totals[series] = totals.get(series, 0) + int(rect.get_attribute("data-value") or 0)
    return totals


def test_usage_draws_the_api_figures_to_the_micro_dollar(page: Any, gateway: Proc,
                                                         spent: dict[str, Any],
                                                         shots: Path) -> None:
    """Usage for team research stacked by model: the drawn µUSD per model equal the
    summary API's, their total /v1/usage's team day; every segment's tooltip is its
    exact µUSD; stacked by client tool, the openai and anthropic SDKs' spend apart as
    the API sums it; comparing research with ops draws two panels on one scale."""
    sign_in(page, WRITE)
    page.goto("/console/usage")
    page.get_by_label("Team", exact=True).select_option("research")
    page.get_by_label("Stacked by").select_option("model")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"team=research"))
    summary = api(gateway, "/admin/v1/requests/summary?group_by=model&bucket=none"
                  "&team=research", READ)["data"]
    by_model = {r["model"]: r["usd_committed"] for r in summary}
    assert {"gpt-local", "claude-local"} <= set(by_model)
    chart = page.locator('figure[data-chart="usd"]').first
    drawn = _drawn(chart)
    drawn.pop("liability", None)
    assert drawn == {m: v for m, v in by_model.items() if v}
    usage = {(r["scope"], r["window"]): r for r in api(
        gateway, "/v1/usage", spent["research"])["data"]}
    assert sum(drawn.values()) == usage[("team", "day")]["usd_committed"] > 0
    rect = chart.locator('rect[data-series="claude-local"]').first
    value = int(rect.get_attribute("data-value"))
    assert rect.locator("title").text_content().endswith(
        f"{value:,} µUSD (${value // 1_000_000:,}.{value % 1_000_000:06d})")
    cells = page.locator('table.usage td[data-figure="usd_committed"]').all()
    assert sum(int(c.get_attribute("data-value")) for c in cells) == sum(by_model.values())
    page.screenshot(path=shots / "usage.png", full_page=True)

    page.goto("/console/usage?team=research&group=tool")
    by_tool = {r["tool"]: r["usd_committed"] for r in api(
        gateway, "/admin/v1/requests/summary?group_by=tool&bucket=none&team=research",
        READ)["data"]}
    assert {"openai-python", "anthropic-python"} <= set(by_tool)
    drawn = _drawn(page.locator('figure[data-chart="usd"]').first)
    drawn.pop("liability", None)
    assert drawn == {t: v for t, v in by_tool.items() if v}

    page.goto("/console/usage?compare=team&a=research&b=ops&group=user")
    panels = page.locator("section.panel")
    assert panels.count() == 2
    for i, (team, user) in enumerate((("research", "bo"), ("ops", "cy"))):
        committed = api(gateway, f"/admin/v1/requests/summary?team={team}&bucket=none",
                        READ)["data"][0]["usd_committed"]
        seen = _drawn(panels.nth(i).locator('figure[data-chart="usd"]'))
        assert seen.get(user) == committed
    page.screenshot(path=shots / "usage-compare.png", full_page=True)


def test_an_operator_opens_a_request_and_resolves_an_uncertain_permit(
        page: Any, gateway: Proc, spent: dict[str, Any], shots: Path) -> None:
    """Requests → the cut stream's row → its page (outcome uncertain, liability, the
    counters it charged); Operations lists it under liability awaiting resolution;
    settled there at an exact cost, the API shows it complete with no liability."""
    [permit] = api(gateway, "/admin/v1/permits?status=uncertain", READ)["data"]
    sign_in(page, WRITE)
    page.goto(f"/console/requests?model={CUT}")
    page.locator("a[data-detail]").first.click()
    page.wait_for_url(re.compile(rf"/console/requests/{permit['permit_id']}$"))
    assert page.locator('[data-figure="status"]').inner_text().startswith("uncertain")
    liability = page.locator('[data-figure="usd_liability"]').inner_text()
    assert liability.startswith(f"{permit['usd_liability']:,} µUSD")
    detail = api(gateway, f"/admin/v1/requests/{permit['permit_id']}", READ)
    assert page.locator("tr[data-segment]").count() == len(detail["segments"]) > 0
    assert page.locator('[data-figure="tool"]').inner_text() == detail["request"]["tool"] \
        == "openai-python"
    page.screenshot(path=shots / "request.png", full_page=True)

    page.goto("/console/operations")
    row = page.locator(f'tr[data-permit="{permit["permit_id"]}"]')
    assert row.get_attribute("data-status") == "uncertain"
    assert page.locator('[data-figure="profile"]').inner_text() == "local"
    # Every table within the page at 1280 px, the resolve form included; a time on one line.
    assert page.locator(".table-wrap").evaluate_all(
        "ws => ws.every(w => w.scrollWidth <= w.clientWidth)")
    assert row.locator("td.time time").evaluate("e => e.getClientRects().length") == 1
    page.screenshot(path=shots / "operations.png", full_page=True)
    row.get_by_label("Exact cost (µUSD)").fill("777")
    row.get_by_label("Exact tokens (optional)").fill("12")
    row.get_by_label("Reason").last.fill("provider invoice")
    row.get_by_role("button", name=re.compile("^Settle .* at this exact cost$")).click()
    page.locator("[data-done]").wait_for()
    settled = api(gateway, f"/admin/v1/requests/{permit['permit_id']}", READ)["request"]
    assert (settled["status"], settled["usd_committed"], settled["usd_liability"]) == (
        "complete", 777, 0)
    assert page.get_by_text("No liability awaiting resolution.").is_visible()


def test_a_read_token_has_no_operations_action_and_its_forged_post_is_refused(
        page: Any, gateway: Proc, spent: dict[str, Any]) -> None:
    """Read token: Operations shows the status and lists but no Resolve, Settle or
    Unfreeze button; its forged resolve POST (with its own CSRF token) is a 403 and the
    permit keeps its liability."""
    oa = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=spent["research"],
                       max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in oa.chat.completions.create(model=CUT, max_tokens=16, stream=True,
                                            messages=[{"role": "user", "content": "c2"}]):
            pass
    before = api(gateway, "/admin/v1/permits?status=uncertain", READ)["data"]
    assert len(before) == 1
    sign_in(page, READ)
    page.goto("/console/operations")
    assert page.locator(f'tr[data-permit="{before[0]["permit_id"]}"]').count() == 1
    for name in ("Resolve", "Settle", "Unfreeze"):
        assert page.get_by_role("button", name=re.compile(name)).count() == 0
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value")
    r = page.request.post(f"/console/operations/permits/{before[0]['permit_id']}/resolve",
                          form={"csrf": csrf, "as": "cancelled"})
    assert r.status == 403 and "read-only" in r.text()
    assert api(gateway, "/admin/v1/permits?status=uncertain", READ)["data"] == before
