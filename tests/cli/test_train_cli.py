"""`resid train-sae`, `resid train-transcoder` and `resid train-clt` on a tiny random model and a small corpus file:
each writes a SAELens folder per layer (the CLT: circuit-tracer's folder) that resid loads back, and the evaluation
table; `resid eval-dictionaries` compares the per-layer transcoders and the CLT as replacements, with graph scores;
a finished run resumes with --resume (and trains nothing more); a second command training into a folder another
process is training into is refused, naming that process; bad arguments fail before the model loads, named by
their flags."""

import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import build

import resid
from resid.analyses.cli.main import main

WORDS = "the nation budget congress people peace economy world freedom work health school future".split()
NO_MODEL = ["--model", "no-such-model"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("train_cli")
    build("llama", root / "model")
    paragraphs = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12 + i % 5)) + "." for i in range(80)]
    (root / "corpus.txt").write_text("\n\n".join(paragraphs) + "\n")
    return {"model": str(root / "model"), "corpus": str(root / "corpus.txt"), "root": str(root)}


def _run(argv: list[str], capsys) -> str:
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_train_sae_and_transcoders_write_loadable_folders(setup, capsys) -> None:
    common = ["--model", setup["model"], "--corpus", setup["corpus"], "--tokens", "256", "--batch-size", "64",
              "--window", "16", "--buffer-tokens", "200", "--eval-windows", "4", "--quiet", "--k", "4",
              "--expansion", "2"]
    out = Path(setup["root"]) / "sae"
    printed = _run(["train-sae", "--layers", "0,1", "--out", str(out), *common], capsys)
    assert "trained 2 topk SAE(s)" in printed and "ce_loss_recovered" in printed and "\\_" not in printed
    model = resid.load(setup["model"])
    for layer in (0, 1):
        sae = resid.dictionaries.load(out / f"blocks.{layer}.hook_resid_post", model)
        assert sae.activation == "topk" and sae.k == 4 and sae.d_sae == 2 * model.config.d_model
    assert (out / "evaluation.md").is_file()
    printed = _run(["train-sae", "--layers", "0,1", "--out", str(out), "--resume", *common], capsys)
    assert "trained 2" in printed  # resumed at the end: nothing left to train

    out = Path(setup["root"]) / "transcoders"
    printed = _run(["train-transcoder", "--layers", "1", "--skip", "--out", str(out), *common], capsys)
    assert "trained 1 batchtopk transcoder(s)" in printed
    found = resid.dictionaries.load(out / "blocks.1.ln2.hook_normalized-to-blocks.1.hook_mlp_out", model)
    assert found.is_transcoder and found.W_skip is not None and found.activation == "jumprelu"
    recipe = found.metadata["recipe"]  # scaled to the budget: transcoders normalised, dead after a tenth of it
    assert recipe["normalize"] == "expected_average_only_in" and recipe["dead_tokens"] == 64
    assert recipe["threshold_beta"] == 0.0  # 4 steps: the threshold averages over the last one (a quarter of them)
    assert set(found.metadata["folded_scaling_factors"]) == {"in", "out"}


def test_train_clt_then_eval_dictionaries_compares_it_with_per_layer_transcoders(setup, capsys) -> None:
    common = ["--model", setup["model"], "--corpus", setup["corpus"], "--tokens", "256", "--batch-size", "64",
              "--window", "16", "--buffer-tokens", "200", "--quiet", "--k", "4", "--expansion", "2"]
    root = Path(setup["root"])
    printed = _run(["train-clt", "--out", str(root / "clt"), "--eval-windows", "4", *common], capsys)
    assert "trained a batchtopk cross-layer transcoder" in printed and "(circuit-tracer's CLT format)" in printed
    assert "ce_loss_recovered" in printed and (root / "clt" / "evaluation.md").is_file()
    model = resid.load(setup["model"])
    clt = resid.dictionaries.load(root / "clt" / "clt", model)
    assert isinstance(clt, resid.dictionaries.CrossLayerTranscoder) and clt.d_sae == 2 * model.config.d_model
    _run(["train-transcoder", "--layers", "all", "--out", str(root / "per-layer"), "--eval-windows", "0", *common],
         capsys)

    out = root / "comparison"
    printed = _run(["eval-dictionaries", f"tc={root / 'per-layer'}", str(root / "clt" / "clt"), "--out", str(out),
                    "--model", setup["model"], "--corpus", setup["corpus"], "--eval-windows", "4", "--window", "16",
                    "--prompt", "the nation budget congress", "--quiet"], capsys)
    assert "2 replacement(s) of every MLP" in printed and "1 prompt graph(s)" in printed
    table = (out / "evaluation.md").read_text()
    assert "| tc " in table and "| clt " in table and "cross-layer" in table and "completeness\\_score" in table
    for name in ("evaluation.md", "per-layer.csv", "report.html", "graph-tc.html", "graph-clt.html"):
        assert (out / name).is_file(), name
    assert "FVU of the layer" in (out / "report.html").read_text()


def test_a_buffer_larger_than_the_run_is_cut_to_the_run(setup, capsys, tmp_path) -> None:
    """--buffer-tokens above --tokens filled the buffer from the whole corpus before step 1: it is cut to the
    tokens the run trains on, and said so."""
    from resid.analyses.io.checkpoints import saved_settings

    out = tmp_path / "sae"
    argv = ["train-sae", "--layers", "0", "--out", str(out), "--model", setup["model"], "--corpus", setup["corpus"],
            "--tokens", "150", "--batch-size", "64", "--window", "16", "--buffer-tokens", "1000000", "--eval-windows",
            "0", "--quiet", "--k", "4", "--expansion", "2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "resid: a shuffling buffer of 128 tokens, the whole training budget (--buffer-tokens 1,000,000 is more " \
           "than the run trains on, and a buffer is filled before its first step)" in err, err
    assert saved_settings(out)["buffer_tokens"] == 128


# Another process training into a folder: it holds the folder's checkpoint store (and so its lock) until told to go.
HOLDER = """
import sys
from resid.analyses.io.checkpoints import StateStore
store = StateStore(sys.argv[1], "resid.training.checkpoint", "training", {})
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_second_command_training_into_the_same_folder_is_refused(setup, capsys, tmp_path) -> None:
    out = tmp_path / "busy"
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert first.stdout.readline().strip() == "ready"
        argv = ["train-sae", "--layers", "0", "--out", str(out), "--model", setup["model"], "--corpus", setup["corpus"],
                "--tokens", "128", "--batch-size", "64", "--window", "16", "--buffer-tokens", "200", "--quiet"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"Another process (pid {first.pid}" in err and f"to {out}" in err and "--out" in err, err
        assert not (out / "checkpoint.safetensors").exists()
    finally:
        first.communicate("done\n", timeout=60)


@pytest.mark.parametrize("argv, message", [
    (["train-sae", "--layers", "1", "--out", "x", "--tokens", "0"], "--tokens must be at least 1"),
    (["train-sae", "--layers", "one", "--out", "x"], "--layers must be integers"),
    (["train-sae", "--layers", "1", "--out", "x", "--tokens", "100", "--batch-size", "200"], "less than one batch"),
    (["train-transcoder", "--layers", "1", "--out", "x", "--lr", "-1"], "--lr -1.0 must be positive"),
    (["train-sae", "--layers", "1", "--out", "x", "--tokens", "8192", "--warmup-steps", "5"],
     "--warmup-steps 5 + --decay-steps 0 must be at most --tokens / --batch-size"),
    (["train-transcoder", "--layers", "1", "--out", "x", "--workers", "2"], "--workers goes with --ray [ADDRESS]"),
    (["train-clt", "--out", "x", "--tokens", "0"], "--tokens must be at least 1"),
    (["eval-dictionaries", "x", "--out", "x"], "is not a folder"),
    (["eval-dictionaries", ".", "--out", "x", "--prompt", ""], "--prompt '' is empty"),
    (["eval-dictionaries", "a=.", "a=.", "--out", "x"], "Two replacements are named 'a'"),
    (["eval-dictionaries", "../../x=.", "--out", "x"], "the replacement's name '../../x' names files in --out "
     "(graph-NAME.html), so it must be letters, digits, '_', '-' and '.', starting with a letter or digit"),
    (["eval-dictionaries", "a/b=.", "--out", "x"], "Name it with NAME=FOLDER"),
    (["eval-dictionaries", ".hidden=.", "--out", "x"], "starting with a letter or digit"),
    (["train-sae", "--layers", "1", "--out", "x", "--warmup-steps", "-1"], "--warmup-steps must be at least 0, got -1"),
    (["train-sae", "--layers", "1", "--out", "x", "--decay-steps", "-3"], "--decay-steps must be at least 0, got -3"),
    (["train-clt", "--out", "x", "--seed", str(2**63)], "--seed must be a whole number from 0 to 2^63 - 1"),
    (["train-sae", "--layers", "1", "--out", "x", "--seed", "-1"], "--seed must be a whole number from 0 to 2^63 - 1"),
    (["train-clt", "--out", "x", "--activation", "jumprelu", "--tanh-scale", "nan"],
     "--tanh-scale must be a positive finite number"),
    (["train-clt", "--out", "x", "--activation", "jumprelu", "--tanh-scale", "-2"],
     "--tanh-scale must be a positive finite number"),
    (["train-sae", "--layers", "1", "--out", "x", "--site", "mlp_out"], "--site mlp_out is TransformerLens's name; "
     "the command line takes resid's Site words: --site mlp"),
    (["train-sae", "--layers", "1", "--out", "x", "--site", "attn_out"], "--site attn"),
    (["train-sae", "--layers", "1", "--out", "x", "--site", "mlp.out"], "choose one of resid_pre, resid_mid, "
     "resid_post, attn, mlp"),
    (["train-clt", "--out", "x", "--tanh-scale", "2"], "--tanh-scale 2.0 sets the JumpReLU sparsity term, which "
     "--activation batchtopk does not have: drop --tanh-scale, or use --activation jumprelu"),
])
def test_bad_arguments_are_named_by_their_flags_before_the_model_loads(argv, message, capsys, tmp_path) -> None:
    argv = [a if a != "x" else str(tmp_path / "out") for a in argv]
    assert main(argv + NO_MODEL) == 2
    err = capsys.readouterr().err
    assert message in err and "no-such-model" not in err, err
