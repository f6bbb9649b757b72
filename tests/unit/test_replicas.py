"""server.workers: its range and lease refusal, each worker's files, the journals no
worker of a run owns."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from gateway.config import Settings, load_settings
from gateway.errors import ConfigError
from gateway.replicas import (
    audit_path,
    journal_path,
    numbered,
    orphan_journals,
    worker_settings,
)

MOCK = {"providers": [{"name": "m", "kind": "mock"}],
        "models": [{"name": "x", "deployments": [{"provider": "m"}]}]}


def _settings(tmp_path: Path, **server: object) -> Settings:
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump({**MOCK, "data_dir": str(tmp_path / "data"),
                                    "server": {"replica_id": "gw", **server}}))
    return load_settings(path)


@pytest.mark.parametrize("workers", [0, 65, -1, "two"])
def test_out_of_range_workers_are_refused_by_key(tmp_path: Path, workers: object) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(tmp_path, workers=workers)
    assert "server.workers" in info.value.message


def test_the_lease_profile_refuses_several_workers(tmp_path: Path) -> None:
    """A lease is one node's share of a budget: the lease profile runs one process."""
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump({**MOCK, "server": {"workers": 2},
                                    "control_plane": {"url": "http://127.0.0.1:1"}}))
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.message.endswith(
        "server.workers: the lease profile runs one process per node (its leases are the "
        "node's share of a budget), not 2; set 1")


def test_default_is_one_process(tmp_path: Path) -> None:
    assert load_settings(None).server.workers == 1
    assert _settings(tmp_path, workers=4).server.workers == 4


def test_each_worker_is_a_replica_with_its_own_files(tmp_path: Path) -> None:
    base = _settings(tmp_path, workers=3)
    data = tmp_path / "data"
    assert journal_path(base) == str(data / "journal-gw.jsonl")
    workers = [worker_settings(base, i) for i in range(3)]
    assert [w.server.replica_id for w in workers] == ["gw-0", "gw-1", "gw-2"]
    assert [journal_path(w) for w in workers] == [
        str(data / f"journal-gw-{i}.jsonl") for i in range(3)]
    assert [audit_path(w) for w in workers] == [
        str(data / f"audit-gw-{i}.jsonl") for i in range(3)]
    # Configured paths are numbered the same way; nothing else changes.
    custom = _settings(tmp_path, workers=2, journal_path=str(tmp_path / "j" / "journal.log"),
                       audit_path=str(tmp_path / "a.jsonl"))
    one = worker_settings(custom, 1)
    assert journal_path(one) == str(tmp_path / "j" / "journal-1.log")
    assert audit_path(one) == str(tmp_path / "a-1.jsonl")
    assert msgspec.structs.replace(one.server, replica_id="gw", journal_path=None,
                                   audit_path=None) == msgspec.structs.replace(
        custom.server, journal_path=None, audit_path=None)
    assert numbered("/d/x", 7) == "/d/x-7"


def test_orphans_are_the_journals_no_process_of_the_run_owns(tmp_path: Path) -> None:
    base = _settings(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    for name in ("journal-gw.jsonl", "journal-gw-0.jsonl", "journal-gw-1.jsonl",
                 "journal-gw-3.jsonl", "journal-gw-3.jsonl.lock", "journal-gw-x.jsonl",
                 "journal-gwz-5.jsonl", "journal-other-1.jsonl"):
        (data / name).write_text("")

    def names(worker: tuple[int, int] | None) -> list[str]:
        return [Path(p).name for p in orphan_journals(base, worker)]

    # One process: every numbered journal of its replica (workers ran before).
    assert names(None) == ["journal-gw-0.jsonl", "journal-gw-1.jsonl", "journal-gw-3.jsonl"]
    # Two workers: worker 0 adopts the single process's and those numbered 2 and up.
    assert names((0, 2)) == ["journal-gw-3.jsonl", "journal-gw.jsonl"]
    assert names((1, 2)) == []
    assert names((0, 4)) == ["journal-gw.jsonl"]
