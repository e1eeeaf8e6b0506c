"""--out is checked as writable before the model loads (issue 27, finding 6): a read-only folder is one clear
line in milliseconds, not a PermissionError traceback after the weights have loaded. As in
test_check_before_load, `--model no-such-model` proves the loader never ran (it would say "Unknown model")."""

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from resid.analyses.cli.main import main

NO_MODEL = ["--model", "no-such-model"]
NOBODY = 65534


@contextlib.contextmanager
def unprivileged():
    """Root writes into read-only folders anyway: take an ordinary user's effective id meanwhile (the real id
    stays root, so it can be taken back)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def place():
    """A folder every user may enter, holding a prompts file, a read-only folder and a writable one (pytest's
    own tmp_path is private to its owner, which an unprivileged id could not even enter)."""
    root = Path(tempfile.mkdtemp(prefix="resid-out-"))
    root.chmod(0o755)
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "When Mary and John went", "target": " Mary"}) + "\n")
    (root / "prompts.jsonl").chmod(0o644)
    (root / "pairs.jsonl").write_text(json.dumps({"clean": "a b", "corrupt": "a c", "target": " d"}) + "\n")
    (root / "pairs.jsonl").chmod(0o644)
    (root / "ro").mkdir(mode=0o555)
    (root / "ro").chmod(0o555)  # mkdir's mode is masked by the umask
    (root / "rw").mkdir()
    (root / "rw").chmod(0o777)
    yield root
    shutil.rmtree(root)


COMMANDS = [
    ["attribute", "hi", "--out", "{d}/heads.csv"],
    ["lens", "hi", "--out", "{d}/lens.md"],
    ["decompose", "hi", "--out", "{d}/report"],
    ["ablate", "--prompts", "{root}/prompts.jsonl", "--out", "{d}/r.parquet"],
    ["ablate", "--prompts", "{root}/prompts.jsonl", "--out", "{root}/rw/r.parquet", "--figure", "{d}/r.html"],
    ["patch", "--pairs", "{root}/pairs.jsonl", "--out", "{d}/p.csv"],
    ["neurons", "values", "--layers", "1", "--out", "{d}/values"],
    ["neurons", "edit", "hi", "--neurons", "1:2", "--set", "0", "--out", "{d}/deeper/edit"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(a[:2]) for a in COMMANDS])
def test_a_read_only_out_is_refused_before_the_model_loads(argv, place, capsys):
    read_only = [a.format(root=place, d=place / "ro") for a in argv]
    writable = [a.format(root=place, d=place / "rw") for a in argv]
    # First as ourselves, which also imports what the check needs (unreadable as nobody): the writable place
    # gets as far as the loader.
    assert main(writable + NO_MODEL) == 2
    assert capsys.readouterr().err.startswith("resid: error: Unknown model 'no-such-model'")
    with unprivileged():
        refused = main(read_only + NO_MODEL)
        err = capsys.readouterr().err
        assert refused == 2 and err.startswith("resid: error: --"), err
        assert "cannot be written" in err and "not writable" in err and str(place / "ro") in err
        assert "no-such-model" not in err and len(err.strip().splitlines()) == 1
        # the control, as the same user: the writable place passes the check and reaches the loader (whose
        # message differs as nobody, who cannot read root's Hub cache)
        assert main(writable + NO_MODEL) == 2
        err = capsys.readouterr().err
        assert "no-such-model" in err and "cannot be written" not in err, err


def test_an_out_that_is_a_file_or_a_folder_of_the_wrong_kind(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["attribute", "hi", "--out", str(tmp_path / "file" / "t.csv"), *NO_MODEL]) == 2
    assert f"{tmp_path / 'file'} is a file, not a folder" in capsys.readouterr().err
    assert main(["decompose", "hi", "--out", str(tmp_path / "file"), *NO_MODEL]) == 2
    assert "is a file, but this command writes a folder" in capsys.readouterr().err
    (tmp_path / "t.csv").mkdir()
    assert main(["attribute", "hi", "--out", str(tmp_path / "t.csv"), *NO_MODEL]) == 2
    assert "is a folder; give a file name in it" in capsys.readouterr().err
