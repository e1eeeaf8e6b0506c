"""Hub ids go through huggingface_hub's cache. No network here, so the cache is pre-filled with a tiny
model saved by transformers (exactly the layout snapshot_download leaves) and the Hub is set offline."""

import os
import shutil
import subprocess
import sys

import pytest
from tiny_models import build

from resid.load.hub import FOLDER_ID, REPO_ID

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_hub_id_loads_from_the_hub_cache(tmp_path):
    repo = tmp_path / "hub" / "models--tiny-org--tiny-llama"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    build("llama", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    script = ("import resid; m = resid.load('tiny-org/tiny-llama'); "
              "print(m.config.architecture, m.config.n_layers, m.name)")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["llama", "2", "tiny-org/tiny-llama"]
    shutil.rmtree(snapshot)
    missing = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert "resid.errors.ResidError" in missing.stderr and "could not be reached" in missing.stderr


@pytest.mark.parametrize("text, repo, folder", [
    ("gpt2", True, False), ("EleutherAI/pythia-70m", True, True), ("owner/repo/layer_3/width_16k", False, True),
    ("-x/y", False, False), ("a//b", False, False), ("gpt2\n", False, False), ("./local", False, False),
])
def test_one_rule_says_what_a_hub_id_is(text, repo, folder):
    # a model is a repository; a dictionary may sit in a folder of an owner's repository
    assert (REPO_ID.fullmatch(text) is not None, FOLDER_ID.fullmatch(text) is not None) == (repo, folder)
