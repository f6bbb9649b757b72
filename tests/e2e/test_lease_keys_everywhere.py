"""Keys made at inferplaned's admin surface work on every lease plane (issue 35).

inferplaned (a writer and a data-plane token, no identity section) leases three
node-local planes (``mayu serve`` with SQLite stores and ``control_plane``), each of team
``eng``, which also exists in Postgres. ``POST /v1alpha1/teams/eng/keys`` makes a key
whose hash every plane learns from its next heartbeat answer (``SyncResponse.people``);
``POST /v1alpha1/keys/{id}/revoke`` puts it on the deny list of the next answer.

The planes heartbeat every :data:`HEARTBEAT_S` seconds with :data:`ANSWER_S` as their
sync timeout. The module takes about 30 to 40 s on a loaded machine: its setup starts
inferplaned and three planes, each with its CLI calls (about 20 s), and the tests wait
for heartbeats (a few seconds each).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.e2e._lease import (
    ADMIN_TOKEN,
    MODEL,
    WRITER_TOKEN,
    LeaseStack,
    chat_status,
    first_status,
    refused_within_heartbeats,
    wait_until,
)

pytestmark = pytest.mark.e2e

HEARTBEAT_S = 1.0
"""Each plane's heartbeat interval (``control_plane.max_heartbeat_interval_s``)."""
ANSWER_S = 5.0
"""Each plane's sync timeout (``control_plane.timeout_s``; generous on a loaded machine)."""
PLANES = ("node-a", "node-b", "node-c")
TEAM = "eng"
USER = "ada@example.com"
SECRETS: list[str] = []
"""Every key secret inferplaned answered in this module (none may reach a file)."""


@pytest.fixture(scope="module")
def stack(pg_module_dsn: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LeaseStack]:
    """inferplaned and three planes of team eng (eng also in Postgres)."""
    workdir = tmp_path_factory.mktemp("lease-keys")
    stack = LeaseStack(workdir=workdir, dsn=pg_module_dsn)
    try:
        stack.start_control()
        stack.postgres_team(TEAM)  # the key store keys are made in
        for name in PLANES:
            stack.add_plane(name, teams=[TEAM], control_plane={
                "max_heartbeat_interval_s": HEARTBEAT_S, "timeout_s": ANSWER_S})
        yield stack
    finally:
        stack.stop()


def _writer() -> dict[str, str]:
    return {"Authorization": f"Bearer {WRITER_TOKEN}"}


def _make_key(stack: LeaseStack, name: str) -> dict[str, Any]:
    r = httpx.post(f"{stack.control_url}/v1alpha1/teams/{TEAM}/keys", headers=_writer(),
                   json={"name": name, "user": USER}, timeout=30)
    assert r.status_code == 201, r.text
    made: dict[str, Any] = r.json()
    SECRETS.append(made["key"])
    return made


def _held(stack: LeaseStack, plane: str, key_id: str) -> list[tuple[Any, ...]]:
    """The plane's own row of ``key_id``: (display prefix, name, user, revoked at)."""
    data_dir = yaml.safe_load(stack.configs[plane].read_text())["data_dir"]
    with sqlite3.connect(f"{data_dir}/mayu.db") as conn:
        return conn.execute("SELECT display_prefix, name, user, revoked_at FROM keys "
                            "WHERE id = ?", (key_id,)).fetchall()


def _permits(stack: LeaseStack, plane: str) -> int:
    data_dir = yaml.safe_load(stack.configs[plane].read_text())["data_dir"]
    with sqlite3.connect(f"{data_dir}/mayu.db") as conn:
        return int(conn.execute("SELECT count(*) FROM gov_permits").fetchone()[0])


def _spent(stack: LeaseStack, plane: str, key_id: str) -> list[int]:
    """The settled µUSD of each request of ``key_id`` in the plane's request log."""
    r = httpx.get(f"{stack.planes[plane].url}/admin/v1/requests", params={"key_id": key_id},
                  headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
    assert r.status_code == 200, r.text
    return [row["usd_committed"] for row in r.json()["data"]
            if row["key_id"] == key_id and row["usd_committed"] is not None]


def test_a_key_made_at_inferplaned_works_on_all_three_planes_with_spend_under_it(
        stack: LeaseStack) -> None:
    """Each plane admits the key from its first heartbeat answer after the key was made
    (time to the first 200 printed); the openai SDK gets 200 on each; each plane's request
    log shows the spend under that key, and the plane holds it as a key of eng and of
    its user, with the hash only (display prefix ``inferplaned``); the plane's own key
    still works."""
    made = _make_key(stack, "ci bot")
    since = time.monotonic()
    bound = HEARTBEAT_S + 2 * ANSWER_S
    delays = first_status(stack, PLANES, made["key"], want=200, meanwhile=(200, 401),
                          since=since, deadline_s=bound + 20)
    print(f"\nkey made -> first 200 (heartbeat {HEARTBEAT_S}s): "
          + ", ".join(f"{n} {delays.get(n, float('nan')):.3f}s" for n in PLANES))
    assert set(delays) == set(PLANES), f"still refused after {bound + 20}s: {delays}"
    assert all(d < bound for d in delays.values()), (bound, delays)
    for name in PLANES:
        url = stack.planes[name].url
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=made["key"], max_retries=0)
        answer = client.chat.completions.create(
            model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hello"}])
        assert answer.choices[0].message.content, name
        wait_until(lambda n=name: len(_spent(stack, n, made["id"])) >= 2,  # type: ignore[misc]
                   what=f"{name}'s request log shows both requests settled", deadline_s=30)
        spent = _spent(stack, name, made["id"])
        assert all(s > 0 for s in spent), (name, spent)
        assert _held(stack, name, made["id"]) == [("inferplaned", "ci bot", USER, None)]
        with httpx.Client() as c:
            status = chat_status(url, stack.keys[(name, TEAM)], c)
            assert status == 200, name


def test_revoked_at_inferplaned_it_is_refused_on_all_three_planes_within_one_heartbeat(
        stack: LeaseStack) -> None:
    """After ``POST /v1alpha1/keys/{id}/revoke`` each plane refuses the key from the first
    heartbeat answer after the revoke. Counted at inferplaned (independent of the
    machine's load): at most two heartbeats of a plane land between the revoke's answer
    and just after its first 401 (the one in flight at the revoke, whose answer may
    predate it, and the next, which carries the deny list). Timed: each plane's delay
    to its first 401 is printed and stays within one interval plus those two round trips
    (``HEARTBEAT_S + 2 * ANSWER_S``). The refusal is the OpenAI shape's 401, nothing is
    charged for it, and the plane's row carries inferplaned's revocation time."""
    made = _make_key(stack, "to revoke")
    with httpx.Client() as client:
        for name in PLANES:
            wait_until(lambda n=name: chat_status(stack.planes[n].url, made["key"],  # type: ignore[misc]
                                            client) == 200,
                       what=f"{name} admits the new key", deadline_s=30)
    r = httpx.post(f"{stack.control_url}/v1alpha1/keys/{made['id']}/revoke",
                   headers=_writer(), timeout=30)
    assert r.status_code == 200 and r.json()["revoked_at"], r.text
    revoked = time.monotonic()
    refused_within_heartbeats(stack, PLANES, made["key"], meanwhile=(200, 401),
                              revoked=revoked, heartbeat_s=HEARTBEAT_S, answer_s=ANSWER_S)
    for name in PLANES:
        url = stack.planes[name].url
        before = _permits(stack, name)
        with pytest.raises(openai.AuthenticationError) as oai:
            openai.OpenAI(base_url=f"{url}/v1", api_key=made["key"],
                          max_retries=0).chat.completions.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert oai.value.status_code == 401 and isinstance(oai.value.body, dict), name
        assert oai.value.body.get("code") == "invalid_api_key", (name, oai.value.body)
        assert _permits(stack, name) == before, name
        [(_, _, _, at)] = _held(stack, name, made["id"])
        assert at is not None, name
        with httpx.Client() as c:  # the plane's own key is untouched
            status = chat_status(url, stack.keys[(name, TEAM)], c)
            assert status == 200, name


def test_no_key_secret_reaches_a_file_of_any_plane_or_inferplaned(stack: LeaseStack) -> None:
    """Every file of the run (the planes' SQLite files and WALs, their logs,
    inferplaned's config and log) holds none of the secrets inferplaned answered: only
    their hashes travel and are kept."""
    if not SECRETS:
        _make_key(stack, "grep only")
        time.sleep(2 * HEARTBEAT_S)
    files = [p for p in Path(stack.workdir).rglob("*") if p.is_file()]
    assert any(p.name == "mayu.db" for p in files) and any(
        p.suffix == ".log" for p in files), files
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"a key secret is in {path}"
