"""The console's pages on a million logged requests: server render time and bytes.

Fills a scratch database with N settled permits (tests/bench/requestlog.py's loader:
20 teams, 200 keys, 3 models over the last 30 days), names the 20 teams (created through
the admin API, the permits moved onto their ids), signs in to the console with a read
token through its form, and times R renders of each page through a real shared-profile
app (Litestar's in-process client; each render includes the console's own in-process
calls to the admin API, as in production):

- Overview (every team's day and month: the summary since the 1st, the teams, alerts);
- Requests filtered (``/console/requests?team=t7``, the newest 50);
- Usage, 30 days by the hour (``/console/usage?since=<30 days ago>&bucket=hour``, every
  team, stacked by model: 720 periods);
- a team's page (``/console/teams/t7``: its limits, its 5 members — the users of its
  permits, two with a budget of their own, three bound by the team's default member
  budget — with today's and this month's spend, and its 10 keys, real ones created
  through the API with the filled permits moved onto their ids, with theirs);

and prints p50/p99 of each, and the bytes a first visit ships: the page's HTML and the
assets it loads (stylesheet, htmx, the console's script), as they are and on the wire
(the assets gzipped for a browser that accepts it; the pages never are)::

    .venv/bin/python tests/bench/console.py [--n 1000000] [--repeats 10]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._bench import run_on_own_database, shared_client  # noqa: E402
from tests.bench.requestlog import _pct, fill  # noqa: E402

READ, WRITE = "bench-console-read-token", "bench-console-write-token"
ASSET = re.compile(r'(?:href|src)="(/console/static/[^"]+)"')


async def _teams(client: Any, dsn: str) -> None:
    """Teams t0…t19 through the API; the filled permits' team_<k> become their ids."""
    ids = []
    for k in range(20):
        r = await client.post("/admin/v1/teams", json={"name": f"t{k}"},
                              headers={"Authorization": f"Bearer {WRITE}"})
        assert r.status_code == 201, r.text
        ids.append((f"team_{k}", r.json()["id"]))
    with psycopg.connect(dsn, autocommit=True) as conn:
        t = time.perf_counter()
        conn.execute("UPDATE permits p SET team_id = m.id FROM (SELECT * FROM unnest("
                     "%(old)s::text[], %(new)s::text[]) AS u(old, id)) m "
                     "WHERE p.team_id = m.old",
                     {"old": [o for o, _ in ids], "new": [i for _, i in ids]})
        conn.execute("VACUUM ANALYZE permits")
        print(f"permits moved onto the 20 teams' ids in {time.perf_counter() - t:.1f} s")


async def _members(client: Any, dsn: str, team: str = "t7") -> None:
    """The team's keys and members through the API: one key per key id its permits
    carry (``key_<k>``, each used by one user, ``user_<k mod 50>``), those permits moved
    onto the new keys' ids; a budget of their own for two of its users, a default member
    budget for the rest."""
    w = {"Authorization": f"Bearer {WRITE}"}
    k0 = int(team.removeprefix("t"))
    ids = []
    for k in range(k0, 200, 20):  # the filled permit i has key i % 200 and team i % 20
        r = await client.post("/admin/v1/keys", headers=w, json={
            "team": team, "name": f"key_{k}", "user": f"user_{k % 50}"})
        assert r.status_code == 201, r.text
        ids.append((f"key_{k}", r.json()["key"]["key_id"]))
    users = sorted({f"user_{k % 50}" for k in range(k0, 200, 20)})
    for user, day in zip(users[:2], (40_000_000, 60_000_000), strict=True):
        r = await client.put(f"/admin/v1/teams/{team}/members/{user}", json={
            "usd_micros_per_day": day, "usd_micros_per_month": 30 * day},
            headers={**w, "If-Match": '"0"'})
        assert r.status_code == 201, r.text
    r = await client.put(f"/admin/v1/teams/{team}/default-member", headers={
        **w, "If-Match": '"0"'}, json={"usd_micros_per_day": 20_000_000})
    assert r.status_code == 201, r.text
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE permits p SET key_id = m.id FROM (SELECT * FROM unnest("
                     "%(old)s::text[], %(new)s::text[]) AS u(old, id)) m "
                     "WHERE p.key_id = m.old",
                     {"old": [o for o, _ in ids], "new": [i for _, i in ids]})
        conn.execute("VACUUM ANALYZE permits")
    print(f"team {team}: {len(ids)} keys, {len(users)} members "
          f"({len(users[:2])} with their own budget, the rest the default)")


async def _sign_in(client: Any) -> None:
    form = await client.get("/console/login")
    token = re.search(r'name="login_csrf" value="([^"]+)"', form.text)
    assert token, form.text
    r = await client.post("/console/login", data={"credential": READ,
                                                  "login_csrf": token.group(1)})
    assert r.status_code == 303, r.text


async def _measure(client: Any, name: str, path: str, repeats: int) -> str:
    spent: list[float] = []
    html = ""
    for _ in range(repeats):
        t = time.perf_counter()
        r = await client.get(path)
        spent.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text[:500]
        html = r.text
    assets = wire = 0
    for asset in sorted(set(ASSET.findall(html))):
        a = await client.get(asset, headers={"Accept-Encoding": "gzip"})
        assert a.status_code == 200, asset
        assets += len(a.content)
        wire += a.num_bytes_downloaded
    size = len(html.encode())
    print(f"{name}: p50 {statistics.median(spent) * 1000:.0f} ms, "
          f"p99 {_pct(spent, .99) * 1000:.0f} ms; {size:,} bytes HTML + {assets:,} "
          f"bytes assets = {size + assets:,} bytes ({size + wire:,} on the wire: the "
          f"assets gzipped, the page not)")
    return html


async def run(dsn: str, n: int, repeats: int) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    fill(dsn, n, now - timedelta(days=30))
    async with shared_client(dsn, {"bench": ("read", READ), "setup": ("write", WRITE)},
                             statement_timeout_s=120, timeout=300) as client:
        client.follow_redirects = False
        await _teams(client, dsn)
        await _members(client, dsn)
        await _sign_in(client)
        since = (now - timedelta(days=30)).strftime("%Y-%m-%dT%H:00:00Z")
        await _measure(client, "Overview", "/console/overview", repeats)
        await _measure(client, "Requests (team t7, newest 50)",
                       "/console/requests?team=t7", repeats)
        await _measure(client, "Usage (30 days by the hour, every team, by model)",
                       f"/console/usage?since={since}&bucket=hour", repeats)
        team = await _measure(client, "Team t7 (5 members, the default, 10 keys)",
                              "/console/teams/t7", repeats)
        assert team.count("<tr data-member=") == 5 and team.count("<tr data-key=") == 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="permits to fill (1000000)")
    ap.add_argument("--repeats", type=int, default=10, help="renders per page (10)")
    args = ap.parse_args()
    run_on_own_database("bench_console", lambda dsn: run(dsn, args.n, args.repeats))


if __name__ == "__main__":
    main()
