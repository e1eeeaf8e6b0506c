"""Every command that writes an --out holds the result store's one-writer lock (`<out>.lock`,
resid.analyses.io.lock) while it computes and writes: a second command into the same --out is refused with the
message the result-store commands give, before its model loads, and leaves the first one's files alone. The tables
`resid qk` and `resid features top` write say which head or feature each row is about."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from tiny_models import build

from resid.analyses.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"
PLT = str(DATA / "circuit_tracer" / "plt")
SAE = str(DATA / "saelens" / "standard")
PROMPT = "The cat sat on the mat because"

# Another process writing into `out`: it holds the lock a result store takes, until told to go.
HOLDER = """
import sys
from pathlib import Path
from resid.analyses.io.lock import OutputLock
out = Path(sys.argv[1])
lock = OutputLock(Path(f"{out}.lock"), out)
lock.acquire()
print("ready", flush=True)
sys.stdin.readline()
lock.release()
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_llama_one_writer")
    build("llama", folder)
    return folder


@pytest.fixture()
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("The weather was fine and the garden was green.\n\nMy neighbour has a cat that sleeps all day.")
    return path


COMMANDS = {  # each writes OUT (a file or a folder)
    "graph": lambda model, out, corpus: ["graph", PROMPT, "--transcoders", PLT, "--out", f"{out}.json"],
    "eval-dictionaries": lambda model, out, corpus: ["eval-dictionaries", PLT, "--corpus", str(corpus), "--out",
                                                     str(out)],
    "qk": lambda model, out, corpus: ["qk", PROMPT, "--transcoders", PLT, "--layer", "1", "--out", f"{out}.csv"],
    "features top": lambda model, out, corpus: ["features", "top", "--dictionary", SAE, "--corpus", str(corpus),
                                                "--quiet", "--out", str(out)],
    "attribute": lambda model, out, corpus: ["attribute", PROMPT, "--out", f"{out}.csv"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_second_writer_of_one_out_is_refused(command, folder, corpus, tmp_path, capsys) -> None:
    argv = [*COMMANDS[command](folder, tmp_path / "result", corpus), "--model", str(folder)]
    out = argv[argv.index("--out") + 1]
    first = subprocess.Popen([sys.executable, "-c", HOLDER, out], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout.readline().strip() == "ready"
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"resid: error: Another process (pid {first.pid}: ") and f"to {out}." in err, err
        assert "Two writers of one --out would mix their rows" in err and len(err.strip().splitlines()) == 1, err
        assert not Path(out).exists()  # nothing written by the refused one
    finally:
        first.communicate("done\n", timeout=60)
    assert main(argv) == 0  # once the first is done, the same command runs, and leaves no lock behind
    assert Path(out).exists() and not Path(f"{out}.lock").exists()


def test_the_qk_table_names_its_head(folder, tmp_path) -> None:
    out = tmp_path / "qk.csv"
    assert main(["qk", PROMPT, "--model", str(folder), "--transcoders", PLT, "--layer", "1", "--head", "2", "--top",
                 "3", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == ["head", "table", "query", "key", "value"]
    assert len(table) == 9 and table["head"].nunique() == 1  # 3 pairs, 3 query-side and 3 key-side terms
    assert table["head"][0].startswith("layers[1].attn.head[2]@")  # the head Site, at its query position


def test_the_features_top_table_names_its_features(folder, corpus, tmp_path) -> None:
    out = tmp_path / "top"
    assert main(["features", "top", "--model", str(folder), "--dictionary", SAE, "--features", "2,5", "--k", "2",
                 "--corpus", str(corpus), "--quiet", "--out", str(out), "--format", "csv"]) == 0
    table = pd.read_csv(out / "feature_contexts.csv")
    assert set(table["site"]) <= {"layers[1].resid_post.feature[2]", "layers[1].resid_post.feature[5]"}
    assert len(table) and (table["site"] == table["feature"].map("layers[1].resid_post.feature[{}]".format)).all()
