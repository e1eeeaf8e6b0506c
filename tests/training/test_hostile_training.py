"""Training under hostile input (issue 38): nothing silently wrong, nothing lost. Settings that would train a NaN
dictionary or lens are refused by name; a run that goes non-finite stops at that step, naming the dictionary (or
translator), the tensor and the remedy, and keeps its last good checkpoint; every damaged checkpoint is one clear
error naming the file; impossible sizes are refused before anything is allocated (before the model loads where
the model is not needed); files are written with the user's umask; the command line says what it will do where
that differs from what was asked, and prints a plain table."""

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tiny_models import build

import resid
from resid.analyses.cli.main import main
from resid.analyses.distributed.execution import Execution
from resid.analyses.io import atomic
from resid.analyses.io.checkpoints import StateStore
from resid.analyses.lenses import training as lens_training
from resid.analyses.training import relu as relu_module
from resid.analyses.training.loop import train
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer, fit
from resid.sites import Site

SITE = Site(1, "resid_post")
RECIPE = Recipe(activation="relu", d_sae=32, steps=8, batch_size=96, warmup_steps=1, dead_tokens=200)
OPTIONS = dict(window=24, buffer_tokens=100)
LENS = lens_training.Recipe(steps=4, tokens_per_step=32, seq_len=16, precision="float32")
NO_MODEL = ["--model", "no-such-model"]
WORDS = "the nation budget congress people peace economy world freedom work health school future".split()


def _in(folder) -> Execution:
    return Execution(batch_size=4, progress=False, out=folder)


class Killed(Exception):
    pass


def _kill_at(stop: int):
    def on_step(step, *_):
        if step == stop:
            raise Killed

    return on_step


def _saved(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), framework="pt") as handle:
        return {n: handle.get_tensor(n) for n in handle.keys()}, handle.metadata()


# --- 1. settings that would train a NaN --------------------------------------------------------------------------
BAD_RECIPES = [
    (dict(lr=1e30), "lr=1e+30 must be positive and at most 1 (Adam moves every weight"),
    (dict(lr=float("inf")), "lr=inf must be a finite number, positive and at most 1"),
    (dict(lr=float("nan")), "lr=nan must be a finite number"),
    (dict(l1_coefficient=float("nan")), "l1_coefficient=nan must be a finite number, zero or more"),
    (dict(l1_coefficient=-1.0), "l1_coefficient=-1.0 must be zero or more"),
    (dict(l0_coefficient=float("inf")), "l0_coefficient=inf must be a finite number"),
    (dict(auxk_alpha=float("nan")), "auxk_alpha=nan must be a finite number"),
    (dict(bandwidth=0.0), "bandwidth=0.0 must be positive"),
    (dict(threshold_beta=1.0), "threshold_beta=1.0 must be in [0, 1)"),
    (dict(clip=float("nan")), "clip=nan must be a finite number, positive, or None"),
    (dict(activation="topk", k=100, d_sae=50), "k=100 must be less than d_sae=50"),
]


@pytest.mark.parametrize("change, message", BAD_RECIPES, ids=[next(iter(c)) + repr(list(c.values())[-1])
                                                              for c, _ in BAD_RECIPES])
def test_a_recipe_that_would_train_a_nan_is_refused_by_name(change, message) -> None:
    with pytest.raises(resid.ResidError, match="Invalid Recipe: .*" + re.escape(message)):
        Recipe(**change)


BAD_LENS_RECIPES = [
    (dict(lr_scale=float("inf")), "lr_scale=inf must be a finite number"),
    (dict(lr_scale=1e9), "lr_scale=1000000000.0 must be positive and at most 1000"),
    (dict(momentum=1.0), "momentum=1.0 must be in [0, 1)"),
    (dict(weight_decay=float("nan")), "weight_decay=nan must be a finite number"),
    (dict(clip=-1.0), "clip=-1.0 must be positive"),
]


@pytest.mark.parametrize("change, message", BAD_LENS_RECIPES, ids=[next(iter(c)) for c, _ in BAD_LENS_RECIPES])
def test_a_lens_recipe_that_would_train_a_nan_is_refused_by_name(change, message) -> None:
    with pytest.raises(resid.ResidError, match="Invalid Recipe: .*" + re.escape(message)):
        lens_training.Recipe(**change)


# --- 2. a run that goes non-finite stops at that step and keeps its last good checkpoint ----------------------
def test_a_nan_batch_stops_before_the_weights_change() -> None:
    trainer = Trainer.new(RECIPE, d_in=8)
    trainer.label = "sae (reading layers[1].resid_post)"
    good = torch.randn(96, 8)
    fit(trainer, [good, good])
    before = {k: v.clone() for k, v in trainer.state().items()}
    bad = good.clone()
    bad[5, 3] = float("nan")
    with pytest.raises(resid.ResidError, match=r"stopped in step 3 of 8: the loss of sae \(reading layers\[1\]"
                                               r"\.resid_post\) is not finite .*lr=.*try 10x lower"):
        fit(trainer, [bad])
    after = trainer.state()
    assert all(torch.equal(before[k], after[k]) for k in before)  # Adam never saw the NaN gradient


def _nan_loss_from(step_at: int):
    original = relu_module.ReLUCoder.loss

    def loss(self, x, y, step, dead=True):
        found, acts, y_hat = original(self, x, y, step, dead)
        return (found * float("nan") if step >= step_at else found), acts, y_hat

    return loss


def _nan_weights_from(step_at: int):
    original = relu_module.ReLUCoder.after_step

    steps = []

    def after_step(self):
        original(self)
        steps.append(None)
        if len(steps) > step_at:  # from the update of step step_at + 1 on
            with torch.no_grad():
                self.W_dec[0, 0] = float("inf")

    return after_step


DIVERGING = [("loss", _nan_loss_from, "the loss of"), ("after_step", _nan_weights_from, "W_dec of")]


@pytest.mark.parametrize("method, make, culprit", DIVERGING, ids=[d[0] for d in DIVERGING])
def test_a_diverging_run_stops_and_keeps_its_last_good_checkpoint(bos_model, texts, tmp_path, monkeypatch, method,
                                                                   make, culprit) -> None:
    recipe = Recipe(activation="relu", d_sae=32, steps=8, batch_size=96, warmup_steps=1, dead_tokens=10**9)
    monkeypatch.setattr(relu_module.ReLUCoder, method, make(4))
    with pytest.raises(resid.ResidError, match=rf"Training stopped in step \d of 8: {culprit} "
                                               r"blocks\.1\.hook_resid_post \(reading layers\[1\]\.resid_post\)"):
        train(bos_model, texts, [SITE], recipe, _in(tmp_path), checkpoint_every=2, **OPTIONS)
    tensors, metadata = _saved(tmp_path / "checkpoint.safetensors")
    assert int(metadata["step"]) == 4  # the last checkpoint before the first non-finite value, not overwritten
    assert all(bool(t.isfinite().all()) for t in tensors.values() if t.is_floating_point())
    assert not list(tmp_path.glob("blocks.*"))  # no dictionary written


def test_a_diverging_lens_stops_naming_the_translator(bos_model, texts, tmp_path, monkeypatch) -> None:
    original = lens_training._backward

    def backward(model, weight, bias, *args):
        original(model, weight, bias, *args)
        if len(losses_seen) >= 2:
            weight.grad[1, 0, 0] = float("nan")

    losses_seen: list = []
    monkeypatch.setattr(lens_training, "_backward", backward)
    with pytest.raises(resid.ResidError, match=r"Tuned-lens training stopped in step 3 of 4: the gradient of the "
                                               r"weight of the translator at layers\[0\]\.resid_post is not finite"):
        lens_training.train(bos_model, texts, LENS, _in(tmp_path), checkpoint_every=1,
                            on_step=lambda step, loss: losses_seen.append(loss))
    assert int(_saved(tmp_path / "checkpoint.safetensors")[1]["step"]) == 2


# --- 3. every damaged checkpoint is one clear error naming the file ------------------------------------------
def _rewrite(path: Path, tensors=None, metadata=None) -> None:
    saved_tensors, saved_metadata = _saved(path)
    save_file(saved_tensors if tensors is None else tensors, str(path),
              metadata=saved_metadata if metadata is None else metadata)


def _damage(kind: str, path: Path, first: str) -> None:
    tensors, metadata = _saved(path)
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "header bytes flipped":
        data = bytearray(path.read_bytes())
        data[8:40] = bytes(b ^ 0xFF for b in data[8:40])
        path.write_bytes(bytes(data))
    elif kind == "missing settings":
        _rewrite(path, metadata={k: v for k, v in metadata.items() if k != "settings"})
    elif kind == "settings not JSON":
        _rewrite(path, metadata={**metadata, "settings": "{not json"})
    elif kind == "step abc":
        _rewrite(path, metadata={**metadata, "step": "abc"})
    elif kind == "missing tensor":
        _rewrite(path, tensors={k: v for k, v in tensors.items() if k != first})
    elif kind == "wrong shape":
        _rewrite(path, tensors={**tensors, first: tensors[first][:1]})
    elif kind == "wrong dtype":
        _rewrite(path, tensors={**tensors, first: tensors[first].double()})
    elif kind == "NaN":
        tensors[first].view(-1)[0] = float("nan")
        _rewrite(path, tensors=tensors)


DAMAGE = {
    "truncated": "it cannot be read as a safetensors file",
    "empty": "it cannot be read as a safetensors file",
    "header bytes flipped": "it cannot be read as a safetensors file",
    "missing settings": "its metadata has no settings",
    "settings not JSON": "its settings are not JSON",
    "step abc": "its metadata's 'step' is 'abc', not a count",
    "missing tensor": "it has no tensor '{first}'",
    "wrong shape": "its tensor '{first}' is torch.float32 [1, ",
    "wrong dtype": "its tensor '{first}' is torch.float64",
    "NaN": "its tensor '{first}' holds NaN or infinite values",
}


@pytest.fixture(scope="module")
def checkpoints(bos_model, texts, tmp_path_factory) -> dict[str, Path]:
    """A checkpoint of each kind of training, taken mid-run."""
    root = tmp_path_factory.mktemp("checkpoints")
    with pytest.raises(Killed):
        train(bos_model, texts, [SITE], RECIPE, _in(root / "sae"), checkpoint_every=2, on_step=_kill_at(3), **OPTIONS)
    with pytest.raises(Killed):
        lens_training.train(bos_model, texts, LENS, _in(root / "lens"), checkpoint_every=1, on_step=_kill_at(1))
    return {"sae": root / "sae", "lens": root / "lens"}


@pytest.mark.parametrize("job", ["sae", "lens"])
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_naming_the_file(bos_model, texts, checkpoints, tmp_path, job, kind) -> None:
    folder = tmp_path / job
    shutil.copytree(checkpoints[job], folder)
    first = "0.coder.W_enc" if job == "sae" else "weight"
    _damage(kind, folder / "checkpoint.safetensors", first)
    message = f"checkpoint {folder / 'checkpoint.safetensors'} cannot be resumed: {DAMAGE[kind].format(first=first)}"
    with pytest.raises(resid.ResidError) as error:
        if job == "sae":
            train(bos_model, texts, [SITE], RECIPE, _in(folder), **OPTIONS)
        else:
            lens_training.train(bos_model, texts, LENS, _in(folder))
    assert message in str(error.value) and "Delete it (or choose another folder) to start over" in str(error.value)


# --- 4. the command line: one line, exit 2, before the model loads where it can -------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("hostile_cli")
    root.chmod(0o755)  # an unprivileged id must reach the folders below (the read-only test)
    build("llama", root / "model")
    paragraphs = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12 + i % 5)) + "." for i in range(80)]
    (root / "corpus.txt").write_text("\n\n".join(paragraphs) + "\n")
    for path in (root / "model", *(root / "model").iterdir(), root / "corpus.txt"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"model": str(root / "model"), "corpus": str(root / "corpus.txt"), "root": str(root)}


def _train_sae(setup, out, *extra) -> list[str]:
    return ["train-sae", "--layers", "0", "--out", str(out), "--model", setup["model"], "--corpus", setup["corpus"],
            "--batch-size", "64", "--window", "16", "--buffer-tokens", "128", "--quiet", "--k", "4",
            "--expansion", "2", *extra]


CLI_BEFORE_LOAD = [
    (["--lr", "inf"], "--lr inf must be a finite number"),
    (["--lr", "1e30"], "--lr 1e+30 must be positive and at most 1"),
    (["--l1-coefficient", "nan", "--activation", "relu"], "--l1-coefficient nan must be a finite number"),
    (["--k", "100", "--d-sae", "50"], "--k 100 must be less than --d-sae 50"),
    (["--d-sae", str(10**12)], f"--d-sae {10**12} cannot fit: even at width 1"),
    (["--expansion", str(10**8)], f"--expansion {10**8} cannot fit: even at width 1"),
]


@pytest.mark.parametrize("extra, message", CLI_BEFORE_LOAD, ids=[" ".join(e[:2]) for e, _ in CLI_BEFORE_LOAD])
def test_train_sae_refuses_before_the_model_loads(setup, tmp_path, capsys, extra, message) -> None:
    argv = _train_sae(setup, tmp_path / "out", "--tokens", "128", *extra)
    argv[argv.index("--model") + 1] = "no-such-model"  # the loader never runs: it would say "Unknown model"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("resid: error: ") and message in err and len(err.strip().splitlines()) == 1, err


def test_lens_train_refuses_a_nan_learning_rate_before_the_model_loads(tmp_path, capsys) -> None:
    assert main(["lens", "train", "--out", str(tmp_path / "lens"), "--lr-scale", "nan", *NO_MODEL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("resid: error: Invalid Recipe: --lr-scale nan must be a finite number"), err


def test_k_above_the_width_is_refused_before_anything_is_allocated(setup, tmp_path, capsys) -> None:
    assert main(_train_sae(setup, tmp_path / "out", "--tokens", "128", "--k", "100000")) == 2
    err = capsys.readouterr().err
    assert "--k 100000 must be less than the 96 features of the dictionary blocks.0.hook_resid_post" in err
    assert "--expansion 2 x its input's width 48" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "checkpoint.safetensors").exists()


def test_a_damaged_checkpoint_is_one_line_on_the_command_line(setup, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(_train_sae(setup, out, "--tokens", "128", "--eval-windows", "0")) == 0
    (out / "checkpoint.safetensors").write_bytes(b"")
    capsys.readouterr()
    assert main(_train_sae(setup, out, "--tokens", "128", "--eval-windows", "0", "--resume")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"resid: error: The training checkpoint {out / 'checkpoint.safetensors'} cannot be "
                          "resumed: it cannot be read as a safetensors file") and len(err.strip().splitlines()) == 1


def test_the_command_line_says_what_it_will_do_and_prints_a_plain_table(setup, tmp_path, capsys) -> None:
    argv = _train_sae(setup, tmp_path / "out", "--tokens", "150", "--eval-windows", "2", "--activation", "batchtopk")
    argv.remove("--buffer-tokens")
    argv.remove("128")
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "resid: training 2 steps of 64 tokens = 128 tokens (--tokens 150 rounded down to whole batches of " \
           "--batch-size 64)" in captured.err
    assert "resid: a shuffling buffer of " in captured.err  # sized from the free memory, and said
    assert "on 2 steps of 64 tokens (128 tokens)" in captured.out
    assert "BatchTopK keeps k=4 features per token on average over each training batch" in captured.out
    assert "\\_" not in captured.out and "| :---" not in captured.out and "d_sae" in captured.out
    assert "d\\_sae" in (tmp_path / "out" / "evaluation.md").read_text()  # the Markdown file keeps its escapes


@contextlib.contextmanager
def unprivileged():
    """Root writes into read-only folders anyway: take an ordinary user's effective id meanwhile."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.mark.parametrize("command", ["train-sae", "lens train"])
def test_a_read_only_out_is_one_line(setup, capsys, command) -> None:
    root = Path(tempfile.mkdtemp(prefix="resid-ro-"))
    try:
        root.chmod(0o755)
        (root / "ro").mkdir()
        (root / "ro").chmod(0o555)
        out = root / "ro" / "run"
        argv = _train_sae(setup, out, "--tokens", "128") if command == "train-sae" else \
            ["lens", "train", "--out", str(out), "--model", setup["model"], "--corpus", setup["corpus"]]
        with unprivileged():
            code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"resid: error: --out {out} cannot be written"), err
        assert len(err.strip().splitlines()) == 1
    finally:
        shutil.rmtree(root)


# --- 5. files get the user's umask -------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_get_the_users_umask(tmp_path, umask) -> None:
    def private(tmp: Path) -> None:  # as safetensors and mkstemp make files: 0600
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"weights")
        os.close(fd)

    before = os.umask(umask)
    try:
        atomic.write(tmp_path / "w.safetensors", private)
        store = StateStore(tmp_path / "run", "resid.training.checkpoint", "training", {})
        store.save({"w": torch.ones(2)}, {"step": "1"})
        store.close()
    finally:
        os.umask(before)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "run" / "checkpoint.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_trained_weights_get_the_users_umask(bos_model, texts, tmp_path) -> None:
    before = os.umask(0o022)
    try:
        train(bos_model, texts, [SITE], RECIPE, _in(tmp_path), **OPTIONS)
    finally:
        os.umask(before)
    for name in ("checkpoint.safetensors", "blocks.1.hook_resid_post/sae_weights.safetensors",
                 "blocks.1.hook_resid_post/cfg.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
