"""ResultStore: a killed sweep resumes where it stopped and the final file holds every row exactly once."""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from resid.analyses.io import atomic
from resid.analyses.io.store import ResultStore
from resid.errors import ResidError

KEYS = ["prompt", "site", "layer", "component", "head"]
SIGNATURE = {"model": "smollm2-135m", "prompts": "sha256:ab12", "method": "zero"}
REPO = Path(__file__).resolve().parents[2]


def chunk(prompt: int) -> pd.DataFrame:
    """Rows of one prompt: attention heads (int head) and MLPs (head None), like an ablation sweep."""
    rows = []
    for layer in range(2):
        for head in (0, 1, None):
            component = "mlp" if head is None else "attn"
            site = f"layers[{layer}].{component}"
            rows.append((prompt, site, layer, component, head, prompt + layer / 3 + (head or 0) * 1e-17))
    return pd.DataFrame(rows, columns=[*KEYS, "value"])


def keys_of(frame: pd.DataFrame) -> set[tuple]:
    # Built the way a caller builds them: plain ints, strings and None for a missing head.
    return {(int(p), s, int(l), c, None if pd.isna(h) else int(h)) for p, s, l, c, h in frame[KEYS].itertuples(False)}


def expected(frames: list[pd.DataFrame]) -> pd.DataFrame:
    merged = pd.concat(frames, ignore_index=True)
    return merged.assign(head=merged["head"].astype("Int64"))


@pytest.fixture(params=[".parquet", ".csv"])
def out(request, tmp_path) -> Path:
    return tmp_path / f"sweep{request.param}"


def test_crash_resume_finish(out):
    first = ResultStore(out, KEYS, SIGNATURE)
    assert first.done() == set()
    frames = [chunk(prompt) for prompt in range(3)]
    for frame in frames:
        first.write(frame)
    del first  # a crash: no finish()
    (Path(f"{out}.parts") / f".tmp-chunk-000003{out.suffix}-dead").write_bytes(b"half a chunk")

    again = ResultStore(out, KEYS, SIGNATURE)
    assert not list(Path(f"{out}.parts").glob(".tmp-*")), "a stray temporary file is cleaned up"
    assert again.done() == set().union(*map(keys_of, frames))
    assert (2, "layers[1].mlp", 1, "mlp", None) in again.done()
    again.write(frames[2])  # re-written after a crash between replace and bookkeeping
    frames.append(chunk(3))
    again.write(frames[3])
    result = again.finish()
    pd.testing.assert_frame_equal(result, expected(frames[:3] + frames[3:]))
    assert result["head"].dtype == "Int64" and result["layer"].dtype == "int64"
    assert result["site"].dtype == frames[0]["site"].dtype
    assert not Path(f"{out}.parts").exists() and Path(f"{out}.sweep.json").exists()

    # Resuming after finish: everything is done, and finish gives the same frame back.
    resumed = ResultStore(out, KEYS, SIGNATURE)
    assert resumed.done() == keys_of(result)
    pd.testing.assert_frame_equal(resumed.finish(), result)
    # ... and a longer sweep with the same signature appends after the finished rows.
    resumed.write(chunk(4))
    pd.testing.assert_frame_equal(resumed.finish(), expected([result, chunk(4)]))


def test_exact_floats_and_strings(out):
    rng = np.random.default_rng(0)
    special = [0.1 + 0.2, 1e-300, -0.0, 5e-324, 1.7976931348623157e308, np.inf, -np.inf, np.nan, 1.0, 2.0]
    values = np.concatenate([special, rng.standard_normal(90) * 10.0 ** rng.integers(-300, 300, 90)])
    text = ["1", "NA", "nan", "null", " padded ", 'a "quoted", comma', "line\nbreak", "None", "True", "é"] * 10
    frame = pd.DataFrame({"id": np.arange(100), "value": values, "token": text, "whole": np.arange(100.0)})
    store = ResultStore(out, ["id"], SIGNATURE)
    store.write(frame.iloc[:50])
    store.write(frame.iloc[50:])
    result = store.finish()
    pd.testing.assert_frame_equal(result, frame)
    # assert_frame_equal calls -0.0 equal to 0.0 and NaN equal to NaN: compare the bits too.
    assert np.array_equal(result["value"].to_numpy().view(np.int64), values.view(np.int64))
    pd.testing.assert_frame_equal(ResultStore(out, ["id"], SIGNATURE).finish(), frame)


def test_nothing_written(out):
    result = ResultStore(out, KEYS, SIGNATURE).finish()
    assert result.empty and list(result.columns) == KEYS
    assert not out.exists()
    store = ResultStore(out, KEYS, SIGNATURE)
    store.write(chunk(0).iloc[:0])  # an empty frame writes no chunk
    assert store.done() == set() and not Path(f"{out}.parts").exists()


def test_different_signature_raises(out):
    ResultStore(out, KEYS, SIGNATURE).write(chunk(0))
    with pytest.raises(ResidError, match=r"different sweep.*'method': stored 'zero', now 'mean'"):
        ResultStore(out, KEYS, {**SIGNATURE, "method": "mean"})
    with pytest.raises(ResidError, match=r"different sweep.*'seed': stored '<absent>', now 1"):
        ResultStore(out, KEYS, {**SIGNATURE, "seed": 1})
    with pytest.raises(ResidError, match=r"different sweep.*'\(key_columns\)': stored \['prompt'"):
        ResultStore(out, KEYS[:-1], SIGNATURE)
    ResultStore(out, KEYS, SIGNATURE).finish()
    with pytest.raises(ResidError, match=r"different sweep.*'model'"):
        ResultStore(out, KEYS, {**SIGNATURE, "model": "gpt2"})


def test_bad_input(tmp_path):
    with pytest.raises(ResidError, match=r"must end in one of \.parquet, \.csv"):
        ResultStore(tmp_path / "sweep.json", KEYS, SIGNATURE)
    with pytest.raises(ResidError, match=r"must be JSON-serializable .* Describe the sweep with plain strings, "
                                         r"numbers, lists and dicts"):
        ResultStore(tmp_path / "sweep.csv", KEYS, {"prompts": object()})
    with pytest.raises(ResidError, match="non-empty list"):
        ResultStore(tmp_path / "sweep.csv", "head", SIGNATURE)
    (tmp_path / "foreign.csv").write_text("a\n1\n")
    with pytest.raises(ResidError, match="not written by ResultStore"):
        ResultStore(tmp_path / "foreign.csv", ["a"], SIGNATURE)
    store = ResultStore(tmp_path / "sweep.csv", KEYS, SIGNATURE)
    with pytest.raises(ResidError, match=r"without the key column\(s\) \['head'\]"):
        store.write(chunk(0).drop(columns="head"))
    with pytest.raises(ResidError, match="repeats within the chunk"):
        store.write(pd.concat([chunk(0), chunk(0)]))
    store.write(chunk(0))
    with pytest.raises(ResidError, match=r"same columns \(missing: \['value'\]"):
        store.write(chunk(1).drop(columns="value"))


CHILD = textwrap.dedent(
    """
    import sys, time
    import pandas as pd

    from resid.analyses.io.store import ResultStore  # imports no torch: resid/__init__ is lazy

    store = ResultStore(sys.argv[1], ["step", "row"], {"sweep": "kill-test"})
    done = store.done()
    written = 0
    for step in range(100):
        if (step, 0) in done:
            continue
        rows = range(20)
        store.write(pd.DataFrame({"step": step, "row": rows, "value": [step + row / 7 for row in rows]}))
        written += 1
        time.sleep(float(sys.argv[2]))
    if sys.argv[3] == "finish":
        store.finish()
    print(written)
    """
)


def test_sigkill_mid_sweep(tmp_path):
    # One format is enough here: the kill safety lives in the write path both formats share, and each run
    # costs seconds of fsync on a slow disk. The other tests cover both formats.
    out = tmp_path / "sweep.parquet"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", CHILD, str(out)]
    child = subprocess.Popen([*command, "0.002", "no"], env=env, stdout=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while len(list(Path(f"{out}.parts").glob("chunk-*"))) < 3:
        assert child.poll() is None and time.monotonic() < deadline, "the child died before writing 3 chunks"
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL

    second = subprocess.run([*command, "0", "finish"], env=env, capture_output=True, text=True, check=True)
    assert int(second.stdout) < 100, "the second run skips the chunks the killed one finished"
    result = pd.read_parquet(out)
    assert len(result) == 2000 and not result.duplicated(["step", "row"]).any()
    assert sorted(zip(result["step"], result["row"])) == [(step, row) for step in range(100) for row in range(20)]
    assert (result["value"] == result["step"] + result["row"] / 7).all()


def test_dtypes_settle_across_chunks(out):
    # A chunk of MLP rows has head all None (object), one of heads int64, a mixed one float64 with NaN.
    mlp, attn, mixed = chunk(0).query("component == 'mlp'"), chunk(1).query("head == 0"), chunk(2)
    mlp = mlp.assign(head=[None] * len(mlp))
    attn = attn.assign(head=attn["head"].astype("int64"))
    store = ResultStore(out, KEYS, SIGNATURE)
    for frame in (mlp, attn, mixed):
        store.write(frame)
    assert store.done() == keys_of(mlp) | keys_of(attn) | keys_of(mixed)
    result = store.finish()
    assert result["head"].tolist()[:4] == [pd.NA, pd.NA, 0, 0] and result["head"].dtype == "Int64"
    pd.testing.assert_frame_equal(result, expected([mlp, attn, mixed]))


def test_sidecar_without_out_is_stale(out):
    # finish() writes the sidecar before `out`, so a kill between them, or a user deleting `out` by hand,
    # leaves a sidecar alone: it describes nothing and must not block a new sweep.
    other = {**SIGNATURE, "model": "gpt2"}
    old = ResultStore(out, KEYS, other)
    old.write(chunk(0))
    old.finish()
    out.unlink()
    store = ResultStore(out, KEYS, SIGNATURE)
    assert store.done() == set()
    store.write(chunk(1))
    pd.testing.assert_frame_equal(store.finish(), expected([chunk(1)]))
    assert '"gpt2"' not in Path(f"{out}.sweep.json").read_text()


def test_empty_text_in_csv_reads_as_missing(out):
    # The documented CSV limit: chunks keep no list of missing text cells (a table's sidecar does), so ""
    # and None are one empty field there; Parquet keeps them apart. "NA" and "1" stay strings in both.
    frame = pd.DataFrame({"id": [0, 1, 2, 3], "token": ["", None, "NA", "1"]})
    store = ResultStore(out, ["id"], SIGNATURE)
    store.write(frame)
    result = store.finish()
    assert result["token"].tolist()[2:] == ["NA", "1"] and pd.isna(result["token"].iloc[1])
    assert pd.isna(result["token"].iloc[0]) if out.suffix == ".csv" else result["token"].iloc[0] == ""


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "f.json"
    assert atomic.write(path, "old\r\n", sha256=True) == hashlib.sha256(b"old\r\n").hexdigest()

    def half_then_crash(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.write(path, half_then_crash)
    assert path.read_bytes() == b"old\r\n" and os.listdir(tmp_path) == ["f.json"]
    assert atomic.write(path, lambda tmp: tmp.write_bytes(b"new")) is None and path.read_bytes() == b"new"
