"""The README, followed in order, works: every snippet a newcomer runs, run as written.

The ``sh``, ``python`` and ``yaml`` blocks of "Two commands", "Calling the gateway",
"Keys and teams" and "The admin API and the console" are read from README.md in order.
``./scripts/serve`` is started as the README says (from the checkout, so it installs
only if pyproject.toml changed), with the two flags the README documents: ``--port`` (a
free port) and ``--data-dir`` (a temporary folder); ``./scripts/test`` is the suite this
test belongs to and is not run. Every other block runs as one terminal session would
(exported variables carry over) in a temporary folder holding only a ``.venv`` link to
the checkout's, so ``.venv/bin/...`` resolves as it does from the checkout: a ``yaml``
block is written to the file its first comment names, a ``python`` block runs with
``.venv/bin/python``, a ``sh`` block with bash. The only substitutions are the ones the
README names: the ports (``4000``, ``4001``) by free ones and ``sk-inf-...`` by the
demo key ``./scripts/serve`` printed. Each block must exit 0 and print no error.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.e2e._procs import ROOT, free_port

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
SECTIONS = ("Two commands", "Calling the gateway", "Keys and teams",
            "The admin API and the console")
STEP_TIMEOUT_S = 60


@dataclass
class Step:
    section: str
    lang: str
    text: str
    done: subprocess.CompletedProcess[str] | None = None


@dataclass
class Session:
    """The README's steps, run; the processes they left running (by process group)."""

    home: Path
    ports: dict[str, int]
    key: str = ""
    steps: list[Step] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    serve_log: str = ""

    def of(self, section: str) -> list[Step]:
        return [s for s in self.steps if s.section == section]


def readme_blocks() -> list[Step]:
    """The fenced blocks of the newcomer's sections, in README order."""
    text = README.read_text()
    steps = []
    for section in SECTIONS:
        body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
        steps += [Step(section, lang, block)
                  for lang, block in re.findall(r"```(\w+)\n(.*?)```", body, flags=re.S)]
    return steps


def substituted(text: str, session: Session) -> str:
    """The README's own substitutions: its ports, and the demo key for ``sk-inf-...``."""
    for port, free in session.ports.items():
        text = re.sub(rf"(?<![0-9]){port}(?![0-9])", str(free), text)
    return text.replace("sk-inf-...", session.key)


def _bash(script: str, session: Session, state: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in bash after the session's exported variables, saving them after.

    Its output goes to files, not pipes: a server a step starts with ``&`` keeps them
    open, and the step ends when bash does."""
    wrapped = (f"[ -f {state} ] && source {state}\nset -eo pipefail\n{script}\n"
               f"export -p > {state}\n")
    n = len(session.groups)
    out, err = session.home / f"step-{n}.out", session.home / f"step-{n}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(["bash", "-c", wrapped], cwd=session.home, stdout=stdout,
                                stderr=stderr, start_new_session=True, env=_env(session))
    session.groups.append(proc.pid)
    try:
        code = proc.wait(timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    return subprocess.CompletedProcess(proc.args, code, out.read_text(), err.read_text())


def _env(session: Session) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("INFERPLANE", "PYTHON", "VIRTUAL_ENV"))}
    env["HOME"] = str(session.home)
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, whichever its .venv points at
    return env


def run_step(step: Step, session: Session, state: Path) -> None:
    text = substituted(step.text, session)
    if step.lang == "yaml":
        name = text.splitlines()[0].removeprefix("#").strip()
        assert re.fullmatch(r"[\w.-]+\.yaml", name), f"a yaml block names its file: {text}"
        (session.home / name).write_text(text)
        step.done = subprocess.CompletedProcess([name], 0, "", "")
    elif step.lang == "python":
        step.done = _bash(f".venv/bin/python - <<'README_PY'\n{text}README_PY", session, state)
    else:
        assert step.lang == "sh", step.lang
        step.done = _bash(text, session, state)


def start_serve(step: Step, session: Session) -> None:
    """``./scripts/serve`` from the checkout, with the README's --port and --data-dir."""
    assert step.text.strip() == "./scripts/serve"
    log = session.home / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["./scripts/serve", "--port", str(session.ports["4000"]),
             "--data-dir", str(session.home / ".mayu")],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=_env(session))
    session.groups.append(proc.pid)
    end = time.monotonic() + 120  # an install when pyproject.toml changed, then startup
    while time.monotonic() < end:
        assert proc.poll() is None, log.read_text()
        try:
            ready = httpx.get(f"http://127.0.0.1:{session.ports['4000']}/readyz", timeout=2)
            if ready.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    session.serve_log = log.read_text()
    match = re.search(r"^\s+(sk-inf-[A-Za-z0-9_-]+)$", session.serve_log, flags=re.M)
    assert match, session.serve_log
    session.key = match.group(1)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """Every step of the README, in order, against one ``./scripts/serve``."""
    home = tmp_path_factory.mktemp("readme")
    (home / ".venv").symlink_to(ROOT / ".venv")
    run = Session(home=home, ports={"4000": free_port(), "4001": free_port()})
    state = home / ".readme-env"
    try:
        for step in readme_blocks():
            run.steps.append(step)
            if step.text.strip() == "./scripts/serve":
                start_serve(step, run)
            elif step.text.strip() != "./scripts/test":
                run_step(step, run, state)
                assert step.done is not None
                if step.done.returncode != 0:
                    break  # the steps after it would fail for its reason
        yield run
    finally:
        for group in reversed(run.groups):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)


def _check(steps: list[Step]) -> None:
    """Each step ran, exited 0 and printed no error (an API error body or a traceback)."""
    assert steps
    for step in steps:
        assert step.done is not None, f"not run (an earlier step failed):\n{step.text}"
        out = step.done.stdout + step.done.stderr
        where = f"\n--- step:\n{step.text}\n--- output:\n{out}"
        assert step.done.returncode == 0, where
        assert '"error"' not in out and "Traceback" not in out, where


def test_two_commands_start_the_gateway_and_print_the_demo_key(session: Session) -> None:
    """``./scripts/serve`` serves on the port it was given and prints the demo key once,
    with how to get another."""
    steps = session.of("Two commands")
    assert [s.text.strip() for s in steps] == ["./scripts/serve", "./scripts/test"]
    assert session.serve_log.count(session.key) == 2  # the key, and in the curl line
    assert "mayu keys create --team demo" in session.serve_log


def test_calling_the_gateway_runs_as_written(session: Session) -> None:
    """The SDK snippets (chat, streams, Responses stream, messages, count_tokens) and the
    curl lines answer with the demo key."""
    steps = session.of("Calling the gateway")
    _check(steps)
    assert [s.lang for s in steps] == ["sh", "python", "python", "sh"]
    assert "HTTP/1.1 200" in steps[-1].done.stdout  # type: ignore[union-attr]
    assert "x-inferplane-cost-micro-usd" in steps[-1].done.stdout  # type: ignore[union-attr]


def test_keys_and_teams_runs_as_written(session: Session) -> None:
    """``mayu teams create``, ``keys create``, ``keys list`` and ``keys revoke`` reach
    the running gateway's store."""
    [step] = session.of("Keys and teams")
    _check([step])
    assert step.done is not None and "revoked" in step.done.stdout


def test_the_admin_api_runs_as_written(session: Session) -> None:
    """The second gateway starts on its own port and data folder; the team, the member
    budget and the key are created (no 409: no step repeats an earlier one)."""
    steps = session.of("The admin API and the console")
    _check(steps)
    out = steps[-1].done.stdout  # type: ignore[union-attr]
    assert '"name":"research"' in out and '"source":"member"' in out and '"secret"' in out
    assert (session.home / ".mayu-admin" / "mayu.db").exists()


def test_data_folders_are_git_ignored_and_both_migrate_commands_named() -> None:
    """Every ``.mayu*/`` data folder is git-ignored; examples/shared.yaml names both
    ``mayu migrate`` and ``alembic upgrade head``, once each."""
    done = subprocess.run(["git", "check-ignore", ".mayu/x", ".mayu-admin/x",
                           ".mayu-shared/x"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert done.stdout.split() == [".mayu/x", ".mayu-admin/x", ".mayu-shared/x"]
    shared = (ROOT / "examples" / "shared.yaml").read_text()
    assert shared.count("mayu migrate") == 1 and shared.count("alembic upgrade head") == 1
