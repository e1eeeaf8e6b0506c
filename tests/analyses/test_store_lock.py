"""One writer per result store (issue 27, finding 1): two processes sweeping into the same `out` used to
interleave their chunks under one signature, lose rows and exit 0. A store now holds an exclusive lock on
`<out>.lock` from its construction until finish() or close(); a second process is refused with one clear error
naming the first one's pid, and the first one's table is complete."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from tiny_models import build

import resid
from resid.analyses.io.store import ResultStore
from resid.errors import ResidError

SIGNATURE = {"sweep": "lock-test"}
WRITER = textwrap.dedent(
    """
    import sys
    import pandas as pd
    from resid.analyses.io.store import ResultStore
    from resid.errors import ResidError

    out, role = sys.argv[1], sys.argv[2]
    try:
        store = ResultStore(out, ["step", "row"], {"sweep": "lock-test"})
    except ResidError as error:
        print(error)
        sys.exit(3)
    for step in range(5):
        store.write(pd.DataFrame({"step": step, "row": range(20), "writer": role}))
        if step == 0:
            print("ready", flush=True)
            sys.stdin.readline()  # hold the store open until the parent says go on
    print(len(store.finish()))
    """
)


def test_a_second_process_is_refused_and_the_first_finishes_complete(tmp_path):
    out = tmp_path / "sweep.parquet"
    first = subprocess.Popen([sys.executable, "-c", WRITER, str(out), "first"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "ready"
        second = subprocess.run([sys.executable, "-c", WRITER, str(out), "second"], capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 3, second
        message = second.stdout.strip()
        assert message.startswith(f"Another process (pid {first.pid}: ") and f"writing results to {out}" in message
        assert f"{out}.lock" in message and "choose another output path" in message
        out_, _ = first.communicate("go on\n", timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0 and out_.split()[-1] == "100"
    table = pd.read_parquet(out)
    assert sorted(zip(table["step"], table["row"])) == [(s, r) for s in range(5) for r in range(20)]
    assert set(table["writer"]) == {"first"}
    assert not Path(f"{out}.lock").exists() and not Path(f"{out}.parts").exists()
    # the lock went with the finished store: a new one opens, and finds every row done
    assert len(ResultStore(out, ["step", "row"], SIGNATURE).done()) == 100


def test_within_one_process_the_newest_store_takes_over(tmp_path):
    out = tmp_path / "sweep.csv"
    rows = pd.DataFrame({"step": [0, 0], "row": [0, 1], "value": [1.0, 2.0]})
    old = ResultStore(out, ["step", "row"], SIGNATURE)  # e.g. held by the traceback of an interrupted cell
    old.write(rows)
    new = ResultStore(out, ["step", "row"], SIGNATURE)
    with pytest.raises(ResidError, match="superseded by a newer store of the same output"):
        old.write(rows.assign(step=1))
    assert [p.name.split("-")[0] for p in Path(f"{out}.parts").glob("chunk-*")] == ["chunk"]
    assert all(len(p.stem.split("-")) == 3 for p in Path(f"{out}.parts").glob("chunk-*")), "chunk-N-<writer>"
    assert new.done() == {(0, 0), (0, 1)}
    new.write(rows.assign(step=1))
    assert len(new.finish()) == 4 and not Path(f"{out}.lock").exists()
    new.write(rows.assign(step=2))  # after finish() the store takes its lock again
    assert Path(f"{out}.lock").exists()
    with ResultStore(out, ["step", "row"], SIGNATURE) as again:
        assert len(again.done()) == 6
    assert not Path(f"{out}.lock").exists()


def test_an_unwritable_place_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ResidError, match="Cannot create the lock file .* Choose another output path"):
        ResultStore(tmp_path / "file" / "sweep.csv", ["step"], SIGNATURE)


def _prompts(path: Path, n: int) -> Path:
    names = ["Mary", "John", "Tom", "Anna", "Paul", "Lisa", "Mark", "Emma"]
    lines = [{"prompt": f"When {names[i % 8]} and {names[(i + 3) % 8]} went to the store, {names[(i + 3) % 8]} "
                        f"gave a drink to", "target": f" {names[i % 8]}", "baseline": f" {names[(i + 3) % 8]}"}
             for i in range(n)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _holds(lock: Path, pid: int) -> bool:
    try:
        return lock.read_text().startswith(f"{pid}\n")
    except FileNotFoundError:
        return False


def test_two_resid_ablate_processes_on_one_out(tmp_path):
    # The probe's case: the same sweep with two metrics into one --out. The first is frozen (SIGSTOP) while it
    # holds the store, so the second one runs its whole course meanwhile, whatever the machine's speed.
    folder = tmp_path / "llama"
    build("llama", folder)
    prompts, out = _prompts(tmp_path / "p.jsonl", 8), tmp_path / "mix.csv"
    command = [sys.executable, "-m", "resid.analyses.cli.main", "ablate", "--prompts", str(prompts), "--out",
               str(out), "--sites", "head", "--batch-size", "1", "--model", str(folder), "--quiet"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, lock = time.monotonic() + 120, Path(f"{out}.lock")
        while not _holds(lock, first.pid):  # its pid is written once it holds the lock
            assert first.poll() is None, f"the first sweep ended before it was seen holding its store: {first}"
            assert time.monotonic() < deadline
            time.sleep(0.001)
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run([*command, "--metric", "logit"], capture_output=True, text=True, timeout=300)
        first.send_signal(signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
    assert second.stderr.startswith(f"resid: error: Another process (pid {first.pid}: ")
    assert f"writing results to {out}" in second.stderr and len(second.stderr.strip().splitlines()) == 1
    assert first.returncode == 0, stderr
    assert stdout.startswith(f"{8 * 8} rows (8 prompts)")  # 2 layers x 4 heads per prompt
    table = pd.read_csv(out)
    assert len(table) == 8 * 8 and not table.duplicated(["prompt_idx", "site"]).any()
    assert set(table["metric"]) == {"logit_diff"}
    sidecar = json.loads(Path(f"{out}.sweep.json").read_text())
    assert sidecar["signature"]["metric"] == "logit_diff" and sidecar["resid_version"] == resid.__version__


def test_holder_looks_without_taking_or_creating(tmp_path):
    from resid.analyses.io.lock import holder

    out = tmp_path / "sweep.csv"
    lock = Path(f"{out}.lock")
    assert holder(lock) is None and not lock.exists()  # nothing there: no writer, and no file made by looking
    store = ResultStore(out, ["step"], SIGNATURE)
    assert holder(lock).startswith(f"pid {os.getpid()}: ")  # the command line asks this before loading a model
    store.close()
    assert holder(lock) is None and not lock.exists()


def test_a_store_taken_again_checks_the_files_afresh(tmp_path):
    # Between finish() and a later write, another sweep may have taken the output: the signature is read again.
    out = tmp_path / "sweep.csv"
    rows = pd.DataFrame({"step": [0], "value": [1.0]})
    store = ResultStore(out, ["step"], SIGNATURE)
    store.write(rows)
    store.finish()
    # what a finished sweep of other settings leaves (as another process would, between our finish and write)
    Path(f"{out}.sweep.json").write_text(Path(f"{out}.sweep.json").read_text().replace("lock-test", "another"))
    with pytest.raises(ResidError, match="holds results of a different sweep"):
        store.write(rows.assign(step=1))
