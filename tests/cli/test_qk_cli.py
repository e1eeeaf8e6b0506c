"""`resid qk` end to end on the tiny random Llama of tests/data/dictionaries with the committed circuit-tracer
per-layer set: the printed score and pairs are QK's, --out writes the table, every head without --head, and bad
input ends in one line naming the flag."""

from pathlib import Path

import pandas as pd
import pytest
from tiny_models import build

import resid
import resid.dictionaries
from resid.analyses.cli.main import main
from resid.analyses.graphs.qk import QK

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries" / "circuit_tracer"
PROMPT = "The cat sat on the mat because"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_qk")
    build("llama", folder)
    return folder


def test_qk_prints_the_pairs_and_writes_the_table(folder, tmp_path, capsys) -> None:
    out = tmp_path / "qk.csv"
    assert main(["qk", PROMPT, "--model", str(folder), "--transcoders", str(DATA / "plt"), "--layer", "1",
                 "--head", "2", "--key", "3", "--versus", "mean", "--top", "4", "--validate", "1",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    model = resid.load(folder)
    result = QK(model, PROMPT, resid.dictionaries.load(DATA / "plt", model)).score(1, 2, key=3, versus="mean")
    assert f"the pairs sum to {result.raw:.4f}" in printed
    best = result.top(1).iloc[0]
    assert f"{best.value:+9.4f}  {best.query:<34} x {best.key}" in printed
    assert printed.count("score predicted") == 2  # one query-side and one key-side term removed
    table = pd.read_csv(out)
    assert list(table["table"]) == ["pair"] * 4 + ["query"] * 4 + ["key"] * 4
    assert table[table["table"] == "query"]["value"].abs().is_monotonic_decreasing


def test_without_a_head_every_head_of_the_layer(folder, capsys) -> None:
    assert main(["qk", PROMPT, "--model", str(folder), "--transcoders", str(DATA / "plt"), "--layer", "0"]) == 0
    printed = capsys.readouterr().out
    model = resid.load(folder)
    heads = [f"layers[0].attn.head[{h}]@" for h in range(model.config.n_heads)]
    assert all(head in printed for head in heads) and "layers[1].attn" not in printed


@pytest.mark.parametrize(("flags", "message"), [
    (["--head", "1"], "--head 1 needs --layer"),
    (["--layer", "1", "--head", "0", "--versus", "last"], "--versus 'last' is a key position"),
    (["--layer", "0", "--key", "2"], "--key, --versus and --validate explain one head"),
    (["--layer", "1", "--head", "0", "--key", "40"], "outside the prompt's"),
    (["--layer", "1", "--head", "0", "--out", "x.txt"], "--out 'x.txt' must end in one of"),
])
def test_bad_qk_flags_end_in_one_line(folder, flags, message, capsys) -> None:
    assert main(["qk", PROMPT, "--model", str(folder), "--transcoders", str(DATA / "plt"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("resid: error:") and message in err and err.count("\n") == 1
