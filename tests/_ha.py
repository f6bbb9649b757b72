"""A real highly available Postgres for the failover tests: etcd + Patroni + N members.

:func:`start_cluster` starts one etcd (Debian's ``etcd-server``: the only etcd packaged
for the machines CI runs on; PyPI has clients, not the server) and ``members`` Patroni
nodes (Patroni from PyPI, the ``test`` extra) over the installed PostgreSQL binaries
(``/usr/lib/postgresql/*/bin``), every data dir in one throwaway directory, synchronous
replication on (``synchronous_mode``). As root, Patroni (and so initdb and postgres) runs
as the ``postgres`` OS user, as scripts/test's throwaway cluster does.

:meth:`Cluster.crash` is a machine crash of one member (SIGKILL to its Patroni and its
postmaster, whose backends then die): its leader key expires after ``TTL_S`` and Patroni
promotes a standby. :meth:`Cluster.crash_when` aims that crash: it watches the member's
``pg_stat_activity`` and kills it as soon as the given calls are running (with
:meth:`Cluster.stop_streaming` first, they wait in their commits for the synchronous
standby), and returns what the view showed. :meth:`Cluster.revive` starts the member
again (it rejoins as a standby, rewound). :meth:`Cluster.stop` kills everything and
removes the directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.e2e._procs import free_port

ROOT = Path(__file__).resolve().parent.parent
TTL_S = 20
"""Patroni's leader key lifetime (its minimum): a crashed primary is replaced after it."""
SCOPE = "ipt-ha"
APP_USER = "mayu"
APP_PASSWORD = "ha-db-pw-7f3c9e1a"  # noqa: S105 (a test cluster's, checked by scram)
"""The application role (:func:`create_app_database`): its password must never appear in
a file the gateways write."""
PATRONICTL = str(Path(sys.executable).parent / "patronictl")


def pg_bindir() -> str:
    """The newest installed PostgreSQL server binaries."""
    dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                  key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not dirs or not (dirs[-1] / "initdb").exists():
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql "
                           "(scripts/test installs them with apt-get)")
    return str(dirs[-1])


def _patroni_cmd(config: Path) -> list[str]:
    """Patroni from this interpreter's packages (the ``test`` extra), run as the
    ``postgres`` OS user when we are root (postgres refuses root). That user may not
    reach this interpreter (a pyenv under /root): then the system's python3 of the same
    version runs it, on this environment's site-packages."""
    run = [sys.executable, "-m", "patroni", str(config)]
    if os.geteuid() != 0:
        return run
    as_pg = ["runuser", "-u", "postgres", "--"]
    if subprocess.run([*as_pg, sys.executable, "-c", ""], capture_output=True,
                      check=False).returncode == 0:
        return [*as_pg, *run]
    # -S: none of the system's own packages (older builds) in the way of ours.
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    site = ":".join(p for p in sys.path if p.endswith("site-packages"))
    return [*as_pg, "env", f"PYTHONPATH={site}", system, "-S", "-m", "patroni", str(config)]


def _http(method: str, url: str, body: dict[str, Any] | None = None,
          timeout: float = 3.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


@dataclass
class Member:
    name: str
    pg_port: int
    api_port: int
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}"


@dataclass
class Cluster:
    root: Path
    etcd: subprocess.Popen[bytes]
    etcd_port: int
    members: list[Member] = field(default_factory=list)

    # -- addresses ----------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres", *, read_write: bool = True,
            user: str = "postgres") -> str:
        """A DSN listing every member (libpq's multi-host form), read-write by default;
        as ``user`` (APP_USER: with its password, checked by scram)."""
        hosts = ",".join(f"127.0.0.1:{m.pg_port}" for m in self.members)
        attrs = "?target_session_attrs=read-write" if read_write else ""
        auth = f"{APP_USER}:{APP_PASSWORD}" if user == APP_USER else user
        return f"postgresql://{auth}@{hosts}/{dbname}{attrs}"

    def state(self) -> list[dict[str, Any]]:
        """Patroni's view of the members (``GET /cluster`` of any live member)."""
        for m in self.members:
            if m.proc is None or m.proc.poll() is not None:
                continue
            try:
                return list(_http("GET", f"{m.api}/cluster")["members"])
            except OSError:
                continue
        return []

    def leader(self) -> Member | None:
        names = [s["name"] for s in self.state() if s.get("role") == "leader"
                 and s.get("state") == "running"]
        return next((m for m in self.members if m.name in names), None)

    def sync_standby(self) -> Member | None:
        """The synchronous standby (the one Patroni promotes in synchronous mode)."""
        names = [s["name"] for s in self.state() if s.get("role") == "sync_standby"]
        return next((m for m in self.members if m.name in names), None)

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- waiting ------------------------------------------------------------------------

    def wait_healthy(self, *, replicas: int | None = None, deadline_s: float = 90.0,
                     sync: bool = True) -> Member:
        """Until a leader answers writes and ``replicas`` standbys (default: every other
        member) stream from it (one of them synchronous when ``sync``)."""
        want = len(self.members) - 1 if replicas is None else replicas
        end = time.monotonic() + deadline_s
        seen: list[dict[str, Any]] = []
        while time.monotonic() < end:
            seen = self.state()
            leader = self.leader()
            streaming = [s for s in seen if s.get("role") in ("replica", "sync_standby")
                         and s.get("state") in ("streaming", "running")
                         and s.get("lag", 0) in (0, "0")]
            has_sync = any(s.get("role") == "sync_standby" for s in seen)
            if (leader is not None and len(streaming) >= want and (has_sync or not sync)
                    and _writable(leader.dsn())):
                return leader
            time.sleep(0.2)
        raise RuntimeError(f"HA cluster not healthy after {deadline_s}s: {seen}\n"
                           + self.logs())

    def logs(self) -> str:
        return "\n".join(f"--- {m.name}\n{m.log.read_text(errors='replace')[-3000:]}"
                         for m in self.members if m.log.exists())

    # -- control ------------------------------------------------------------------------

    def start_member(self, m: Member) -> None:
        log = m.log.open("ab")
        m.proc = subprocess.Popen(_patroni_cmd(m.config), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  cwd=str(self.root))
        log.close()

    def crash(self, m: Member, *, first: Sequence[int] = ()) -> list[int]:
        """A machine crash of ``m``: SIGKILL to every postgres process and to Patroni.

        Patroni is stopped (SIGSTOP) first, so it cannot restart the postmaster it sees
        die, and the backends ``first`` (a kill's targets, :meth:`crash_when`) are
        killed before the postmaster and the rest: the ones of them still running are
        returned (sent the SIGKILL)."""
        if m.proc is not None:
            _killpg(m.proc.pid, signal.SIGSTOP)
        data = self.root / m.name / "data"
        try:
            tree = _tree(int((data / "postmaster.pid").read_text().split()[0]), data)
        except (OSError, ValueError, IndexError):
            tree = []
        hit = [pid for pid in first if _kill(pid)]
        for pid in tree:
            _kill(pid)
        if m.proc is not None:
            _killpg(m.proc.pid)
            m.proc.wait(timeout=10)
            m.proc = None
        return hit

    def crash_when(self, m: Member, contains: str, *, calls: int = 1,
                   wait_event: str | None = None, deadline_s: float = 10.0) -> Shot:
        """Crash ``m`` (:meth:`crash`) as soon as its ``pg_stat_activity`` shows at least
        ``calls`` statements of APP_USER running whose text ``contains`` this, and (when
        ``wait_event`` is given) a statement of APP_USER waiting on it: ``SyncRep`` is a
        commit written on the primary and waiting for its synchronous standby; the calls
        of one team wait behind it for its row locks. Every running statement of
        APP_USER is killed first. Returns what the view showed; AssertionError if it
        never did within ``deadline_s`` (nothing killed then)."""
        end = time.monotonic() + deadline_s
        rows: list[dict[str, Any]] = []
        with psycopg.connect(m.dsn(), autocommit=True, connect_timeout=3,
                             row_factory=dict_row) as conn:
            while time.monotonic() < end:
                rows = conn.execute(_ACTIVITY, {"user": APP_USER}).fetchall()
                aimed = [r for r in rows if contains in r["query"]]
                if len(aimed) >= calls and (wait_event is None or any(
                        r["wait_event"] == wait_event for r in rows)):
                    hit = self.crash(m, first=[r["pid"] for r in rows])
                    return Shot(rows=rows, aimed=aimed, hit=hit, at=time.monotonic())
                time.sleep(0.002)
        raise AssertionError(f"{m.name}: never {calls} call(s) of {contains!r} (and one "
                             f"waiting on {wait_event}) within {deadline_s}s; running "
                             f"then: {rows}")

    def stop_streaming(self) -> list[int]:
        """SIGSTOP the primary's WAL senders (a replication link that stalls): its
        commits stop leaving it (stopping the standbys' receivers would not do: on one
        machine the WAL already sent waits for them in their sockets). Returns the pids
        for :meth:`resume_streaming`."""
        leader = self.leader()
        assert leader is not None, "no primary to stall"
        try:
            postmaster = (self.root / leader.name / "data" / "postmaster.pid").read_text(
                ).split()[0]
        except (OSError, IndexError):
            return []
        pids = []
        for child in subprocess.run(["pgrep", "-P", postmaster], capture_output=True,
                                    text=True, check=False).stdout.split():
            with contextlib.suppress(OSError):
                if b"walsender" in Path(f"/proc/{child}/cmdline").read_bytes():
                    os.kill(int(child), signal.SIGSTOP)
                    pids.append(int(child))
        return pids

    @staticmethod
    def resume_streaming(pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def revive(self, m: Member) -> None:
        """Start a crashed member again: it rejoins as a standby."""
        self.start_member(m)

    def patch_config(self, change: dict[str, Any]) -> None:
        """Change the cluster's dynamic configuration (``PATCH /config``)."""
        leader = self.leader()
        assert leader is not None, "no leader to change the configuration through"
        _http("PATCH", f"{leader.api}/config", change)

    def switchover(self, candidate: Member | None = None) -> str:
        """A planned switchover with ``patronictl switchover --force``; its output."""
        leader = self.leader()
        assert leader is not None, "no leader to switch over from"
        args = ["switchover", SCOPE, "--leader", leader.name, "--force"]
        if candidate is not None:
            args += ["--candidate", candidate.name]
        done = subprocess.run([PATRONICTL, "-c", str(leader.config), *args],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0 and "Successfully switched over" in done.stdout, (
            done.stdout + done.stderr)
        return done.stdout

    def stop(self) -> None:
        for m in self.members:
            self.crash(m)
        _killpg(self.etcd.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.etcd.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def _writable(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            return row is not None and row[0] is False
    except psycopg.Error:
        return False


_ACTIVITY = """SELECT pid, state, wait_event_type, wait_event,
       coalesce(substring(query FROM 'inferplane_[a-z0-9_]+'), left(query, 80)) AS query,
       (extract(epoch FROM clock_timestamp() - query_start) * 1000)::int AS running_ms
  FROM pg_stat_activity
 WHERE usename = %(user)s AND state = 'active' AND pid <> pg_backend_pid()"""
"""APP_USER's statements running, each named by the first function it calls."""


@dataclass(frozen=True)
class Shot:
    """What a crash aimed by :meth:`Cluster.crash_when` hit."""

    rows: list[dict[str, Any]]
    """APP_USER's running statements as ``pg_stat_activity`` showed them just before
    the kill (pid, state, wait event, the function called, how long it had run)."""
    aimed: list[dict[str, Any]]
    """Those of them the kill was aimed at."""
    hit: list[int]
    """The pids of the backends of ``rows`` still running when they were sent the
    SIGKILL (before the postmaster and the rest)."""
    at: float
    """When (``time.monotonic()``) every process of the member was dead."""


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _killpg(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _tree(pid: int, data: Path) -> list[int]:
    """A postmaster and its children (a crashed machine takes them all), if ``pid``
    still is the postmaster of ``data`` (a stale pid file's pid may be reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return []
    if str(data).encode() not in cmdline:
        return []
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                              check=False).stdout.split()
    return [pid, *map(int, children)]


def _member_config(root: Path, m: Member, etcd_port: int, bindir: str) -> dict[str, Any]:
    home = root / m.name
    return {
        "scope": SCOPE, "name": m.name,
        "log": {"level": "WARNING"},
        "restapi": {"listen": f"127.0.0.1:{m.api_port}",
                    "connect_address": f"127.0.0.1:{m.api_port}"},
        "etcd3": {"hosts": f"127.0.0.1:{etcd_port}"},
        "bootstrap": {
            "dcs": {
                "ttl": TTL_S, "loop_wait": 1, "retry_timeout": 5,
                "synchronous_mode": True,
                "maximum_lag_on_failover": 1048576,
                "postgresql": {
                    "use_pg_rewind": True, "remove_data_directory_on_rewind_failure": True,
                    "remove_data_directory_on_diverged_timelines": True,
                    "parameters": {"wal_log_hints": "on", "max_connections": 200,
                                   "max_wal_senders": 10, "max_replication_slots": 10,
                                   "hot_standby": "on", "fsync": "off",
                                   "full_page_writes": "on"},
                },
            },
            "initdb": [{"auth": "trust"}, {"encoding": "UTF8"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{m.pg_port}",
            "connect_address": f"127.0.0.1:{m.pg_port}",
            "data_dir": str(home / "data"), "bin_dir": bindir,
            "pgpass": str(home / "pgpass"),
            "authentication": {"superuser": {"username": "postgres"},
                               "replication": {"username": "postgres"},
                               "rewind": {"username": "postgres"}},
            "parameters": {"unix_socket_directories": str(home)},
            "pg_hba": ["local all all trust",
                       f"host all {APP_USER} 127.0.0.1/32 scram-sha-256",
                       "host all all 127.0.0.1/32 trust",
                       "host replication all 127.0.0.1/32 trust"],
        },
        "tags": {"nofailover": False, "noloadbalance": False},
    }


def start_cluster(*, members: int = 3, deadline_s: float = 90.0) -> Cluster:
    """etcd and ``members`` Patroni nodes, synchronous replication on, healthy. Tried
    twice: a free port found by :func:`free_port` may be taken by another test's server
    before etcd or Patroni binds it."""
    try:
        return _start_cluster(members=members, deadline_s=deadline_s)
    except RuntimeError:
        return _start_cluster(members=members, deadline_s=deadline_s)


def _start_cluster(*, members: int, deadline_s: float) -> Cluster:
    bindir = pg_bindir()
    root = Path(tempfile.mkdtemp(prefix="inferplane-ha."))
    os.chmod(root, 0o755)
    etcd_port, peer_port = free_port(), free_port()
    (root / "etcd").mkdir()
    etcd = subprocess.Popen(
        ["etcd", "--name", "ha", "--data-dir", str(root / "etcd"),
         "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-cluster", f"ha=http://127.0.0.1:{peer_port}"],
        stdout=(root / "etcd.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    cluster = Cluster(root=root, etcd=etcd, etcd_port=etcd_port)
    try:
        _wait_etcd(etcd_port, deadline_s=30)
        for i in range(members):
            m = Member(name=f"pg{i}", pg_port=free_port(), api_port=free_port(),
                       config=root / f"pg{i}.yml", log=root / f"pg{i}.log")
            (root / m.name).mkdir(mode=0o700)
            m.config.write_text(json.dumps(_member_config(root, m, etcd_port, bindir)))
            cluster.members.append(m)
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres", str(root)], check=True)
        # The first member bootstraps the cluster alone; the others then copy it.
        cluster.start_member(cluster.members[0])
        _wait(lambda: _writable(cluster.members[0].dsn()), deadline_s, cluster)
        for m in cluster.members[1:]:
            cluster.start_member(m)
        cluster.wait_healthy(deadline_s=deadline_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_etcd(port: int, *, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            _http("GET", f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"etcd did not answer on port {port} within {deadline_s}s")


def _wait(ok: Any, deadline_s: float, cluster: Cluster) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if ok():
            return
        if any(m.proc is not None and m.proc.poll() is not None for m in cluster.members):
            break
        time.sleep(0.2)
    raise RuntimeError(f"HA cluster not up after {deadline_s}s\n{cluster.logs()}")


def create_app_database(cluster: Cluster, dbname: str = "inferplane") -> str:
    """A database owned by APP_USER (password-authenticated); its multi-host DSN."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {APP_USER} LOGIN PASSWORD '{APP_PASSWORD}'")
        conn.execute(f"CREATE DATABASE {dbname} OWNER {APP_USER}")
    return cluster.dsn(dbname, user=APP_USER)
