"""The workers' metrics directory and listener: a fresh directory per ``aptix worker``, earlier ones
removed once their process is gone, and dead processes' files folded without losing a count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from aptix_cli.metrics_dir import prepare_directory
from aptix_cli.metrics_export import fold_dead_processes

ROOT = Path(__file__).resolve().parents[2]
LIVE, DEAD, GONE = 222, 111, 333


def _write(path: Path, values: dict[tuple[str, str, tuple[str, ...]], float]) -> None:
    """A metric file as a process in multiprocess mode writes it: (metric, sample, label values) -> value."""
    store = MmapedDict(str(path))
    for (metric, sample, label_values), value in values.items():
        names = ["step"] if sample.endswith("_total") else ["step", "le"][: len(label_values)]
        store.write_value(mmap_key(metric, sample, names, list(label_values), "help"), value, 0.0)
    store.close()


def _collected(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in MultiProcessCollector(None, path=str(directory)).collect()
        for sample in family.samples
    }


def _processes_files(directory: Path) -> None:
    counter = ("aptix_steps", "aptix_steps_total")
    for pid, amount in ((LIVE, 1.0), (DEAD, 2.0), (GONE, 4.0)):
        _write(directory / f"counter_{pid}.db", {(*counter, ("persist",)): amount})
        _write(
            directory / f"histogram_{pid}.db",
            {
                ("aptix_step_seconds", "aptix_step_seconds_bucket", ("persist", "0.1")): amount,
                # a binary fraction: the sums are exact in any order
                ("aptix_step_seconds", "aptix_step_seconds_sum", ("persist",)): amount / 4,
            },
        )
    _write(directory / f"gauge_livesum_{DEAD}.db", {("aptix_busy", "aptix_busy", ("persist",)): 5.0})
    _write(directory / f"gauge_all_{DEAD}.db", {("aptix_last", "aptix_last", ("persist",)): 6.0})


def test_folding_dead_processes_keeps_every_count_and_leaves_one_file_per_kind(tmp_path: Path) -> None:
    # Given files of a live process and of two that died
    _processes_files(tmp_path)
    before = _collected(tmp_path)

    # When the dead ones are folded (twice: the second finds nothing to do)
    folded = fold_dead_processes(tmp_path, alive=lambda pid: pid == LIVE)

    # Then counters and histograms sum as before, the live process's files are untouched,
    # a dead process's live gauge is dropped and its other gauges are left
    assert folded == 5
    assert fold_dead_processes(tmp_path, alive=lambda pid: pid == LIVE) == 0
    assert sorted(p.name for p in tmp_path.glob("*.db")) == [
        "counter_222.db", "counter_dead.db", f"gauge_all_{DEAD}.db", "histogram_222.db", "histogram_dead.db",
    ]  # fmt: skip
    after = _collected(tmp_path)
    assert {k: v for k, v in after.items() if not k[0].startswith("aptix_busy")} == {
        k: v for k, v in before.items() if not k[0].startswith("aptix_busy")
    }
    assert after[("aptix_steps_total", (("step", "persist"),))] == 7.0
    assert not [k for k in after if k[0] == "aptix_busy"]


def test_a_fold_adds_a_later_dead_process_to_the_earlier_ones(tmp_path: Path) -> None:
    _write(tmp_path / f"counter_{DEAD}.db", {("aptix_steps", "aptix_steps_total", ("persist",)): 2.0})
    fold_dead_processes(tmp_path, alive=lambda pid: False)
    _write(tmp_path / f"counter_{GONE}.db", {("aptix_steps", "aptix_steps_total", ("persist",)): 4.0})

    fold_dead_processes(tmp_path, alive=lambda pid: False)

    assert _collected(tmp_path) == {("aptix_steps_total", (("step", "persist"),)): 6.0}


def test_prepare_directory_refuses_once_prometheus_client_counts_in_memory() -> None:
    assert "prometheus_client" in sys.modules
    with pytest.raises(RuntimeError, match="before prometheus_client is imported"):
        prepare_directory()


def test_prepare_directory_makes_a_fresh_one_and_removes_those_of_processes_gone(tmp_path: Path) -> None:
    # Given the directories of an `aptix worker` that is gone and of one still running (this one)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"aptix-metrics-{finished.stdout.strip()}-old"
    running = tmp_path / f"aptix-metrics-{__import__('os').getpid()}-live"
    for directory in (gone, running):
        directory.mkdir()
        (directory / "counter_1.db").write_bytes(b"")

    # When a new process prepares its directory, then imports prometheus_client
    code = (
        "import os, sys; from pathlib import Path; from aptix_cli.metrics_dir import prepare_directory\n"
        "path = prepare_directory(Path(sys.argv[1]))\n"
        "from prometheus_client import values\n"
        "print(path, os.environ['PROMETHEUS_MULTIPROC_DIR'], values.ValueClass._multiprocess)"
    )
    made = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)

    # Then it counts in files of a new, empty directory, and only the gone process's directory was removed
    assert made.returncode == 0, made.stderr
    path, named, multiprocess = made.stdout.split()
    assert path == named and multiprocess == "True"
    assert Path(path).parent == tmp_path and Path(path).name.startswith("aptix-metrics-")
    assert not gone.exists() and running.exists()
    assert list(Path(path).iterdir()) == []
