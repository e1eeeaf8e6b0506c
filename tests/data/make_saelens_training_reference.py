"""Regenerate saelens-training/, the oracle of tests/training/test_saelens_loads_resid_files.py: dictionaries
trained by resid (resid.analyses.training) and saved in SAELens's format, and what SAELens itself computes with
them after loading each folder with its own loader.

    .venv/bin/python tests/data/make_saelens_training_reference.py            # rewrite the committed files
    .venv/bin/python tests/data/make_saelens_training_reference.py --check    # compare with them; exit 1 if not

Run it with a Python that has resid (resid's .venv): resid trains and writes the folders there. SAELens runs in a
virtual environment of its own (default build/saelens-reference-venv, made on first use; this script re-runs
itself inside it with --inside), which never imports resid, so SAELens's outputs cannot agree with resid's by
construction. Pins:
    torch==2.13.0        first, alone: installed by sae-lens's requirements it would pull a multi-GB CUDA build
    sae-lens==6.54.12    the release on PyPI when this was written (tests/data/make_dictionary_reference.py too)
    gguf==0.19.0         not for the fixtures: benchmarks/train_saelens.py's end-to-end mode has transformers read
                         SmolLM2 from resid's GGUF file (resid's own environment has the same gguf)

The dictionaries (d_in 16, 64 features, trained for STEPS steps of BATCH tokens on a synthetic planted-dictionary
stream: no model, no download), one per recipe that SAELens's format can hold:
    topk                     Recipe(activation="topk")       -> SAELens "topk"
    batchtopk                Recipe(activation="batchtopk")  -> SAELens "jumprelu" (its tracked threshold)
    jumprelu                 Recipe(activation="jumprelu")   -> SAELens "jumprelu"
    relu_constant_norm       Recipe(activation="relu", normalize="constant_norm_rescale") -> SAELens "standard"
    batchtopk_skip_transcoder  a transcoder with W_skip      -> SAELens "jumprelu_skip_transcoder"
    batchtopk_skip_transcoder_expected_average  the same, normalize="expected_average_only_in" (its constants folded
                             into the saved weights)         -> SAELens "jumprelu_skip_transcoder"
Each is written by resid.dictionaries.formats.saelens.write, as resid.analyses.training.train writes its folders
(the same metadata). Inside the SAELens environment, SAE.load_from_disk reads each folder, and SAELens's
encode(x) and decode(encode(x)) (forward(x) for the skip transcoder, whose skip path decode does not add) of the
fixed batch `x` in inputs.safetensors are saved as <name>.saelens.safetensors (float32, safetensors). manifest.json
records the versions and the class SAELens built for each; SAELens's LICENSE (MIT) is copied beside them.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent / "saelens-training"
VENV = Path(__file__).resolve().parents[2] / "build" / "saelens-reference-venv"
TORCH, PINS = "torch==2.13.0", ["sae-lens==6.54.12", "gguf==0.19.0"]
D_IN, D_SAE, STEPS, BATCH, N_X, SEED = 16, 64, 40, 128, 12, 0
TOLERANCE = 1e-5  # --check: largest |difference| between SAELens's regenerated outputs and the committed ones
MODEL = "resid-synthetic"
FIXTURES = {  # name -> (Recipe fields, transcoder, skip)
    "topk": (dict(activation="topk", k=4), False, False),
    "batchtopk": (dict(activation="batchtopk", k=4, threshold_start_step=5), False, False),
    "jumprelu": (dict(activation="jumprelu", init_threshold=0.05, l0_coefficient=0.1), False, False),
    "relu_constant_norm": (dict(activation="relu", normalize="constant_norm_rescale", l1_coefficient=0.5),
                           False, False),
    "batchtopk_skip_transcoder": (dict(activation="batchtopk", k=4, threshold_start_step=5), True, True),
    "batchtopk_skip_transcoder_expected_average": (dict(activation="batchtopk", k=4, threshold_start_step=5,
                                                        normalize="expected_average_only_in"), True, True),
}


# ---------------------------------------------------------------------------------------------- resid's side
def synthetic(n: int, generator, transcoder: bool = False):
    """Rows x = codes @ D (+ noise), three planted features active per row at random magnitudes; a transcoder's
    target y = x @ M + codes @ E (a linear part, which its skip path can take, and a sparse part)."""
    import torch

    g = torch.Generator().manual_seed(1234)  # the planted dictionaries: the same in every call
    D, M, E = torch.randn(48, D_IN, generator=g), torch.randn(D_IN, D_IN, generator=g) / 4, torch.randn(48, D_IN,
                                                                                                      generator=g)
    index = torch.rand(n, 48, generator=generator).topk(3, dim=1).indices
    codes = torch.zeros(n, 48).scatter(1, index, 0.5 + 2 * torch.rand(n, 3, generator=generator))
    x = codes @ D + 0.05 * torch.randn(n, D_IN, generator=generator) + 0.3
    return x, (x @ M + codes @ E if transcoder else x)


def hooks(transcoder: bool) -> tuple[str, str | None]:
    return ("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out") if transcoder else \
        ("blocks.0.hook_resid_post", None)


def train_fixture(name: str):
    """The resid Trainer of fixture `name` after STEPS steps (one thread, so that the sums round alike)."""
    import torch

    from resid.analyses.training.recipe import Recipe
    from resid.analyses.training.trainer import Trainer

    fields, transcoder, skip = FIXTURES[name]
    recipe = Recipe(d_sae=D_SAE, steps=STEPS, batch_size=BATCH, warmup_steps=4, seed=SEED, lr=3e-3, **fields)
    trainer = Trainer.new(recipe, D_IN, D_IN, transcoder=transcoder, skip=skip)
    g = torch.Generator().manual_seed(SEED + 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(STEPS):
            x, y = synthetic(BATCH, g, transcoder)
            trainer.step(x, y if transcoder else None)
    finally:
        torch.set_num_threads(threads)
    return trainer


def export(trainer, name: str):
    """The trained dictionary as resid.analyses.training.train exports it (the same metadata)."""
    from dataclasses import asdict

    hook_in, hook_out = hooks(trainer.coder.transcoder)
    recipe = trainer.recipe
    info = {"recipe": asdict(recipe), "tokens": recipe.steps * recipe.batch_size, "data": "synthetic",
            "keep_bos": False, "trainer": "resid.analyses.training"}
    return trainer.coder.dictionary(hook_in, hook_out, name=name, model_name=MODEL, metadata=info)


def write_with_resid(out: Path) -> None:
    """Every fixture trained and written by resid into out/<name>/, and the fixed input batch."""
    import torch
    from safetensors.torch import save_file

    from resid.dictionaries.formats import saelens

    for name in FIXTURES:
        saelens.write(export(train_fixture(name), name), out / name)
    x, _ = synthetic(N_X, torch.Generator().manual_seed(SEED + 2))
    x[0] *= 3  # a row far out, so that constant_norm_rescale's per-row scale is seen
    save_file({"x": x.contiguous()}, str(out / "inputs.safetensors"))


# ---------------------------------------------------------------------------------- inside SAELens's venv
def saelens_outputs(out: Path) -> dict:
    """SAELens loads each folder and encodes / decodes x: <name>.saelens.safetensors, and manifest.json."""
    import importlib.metadata as md

    import torch
    from sae_lens import SAE
    from safetensors.torch import load_file, save_file

    x = load_file(str(out / "inputs.safetensors"))["x"]
    versions = {name: md.version(name) for name in ("sae-lens", "torch")}
    manifest = {"versions": versions, "d_in": D_IN, "d_sae": D_SAE, "steps": STEPS, "batch_size": BATCH,
                "fixtures": {}}
    for name in FIXTURES:
        sae = SAE.load_from_disk(out / name)
        with torch.no_grad():
            acts = sae.encode(x)
            recon = sae.forward(x) if hasattr(sae, "W_skip") else sae.decode(acts)
        save_file({"acts": acts.float().contiguous(), "out": recon.float().contiguous()},
                  str(out / f"{name}.saelens.safetensors"), metadata={"source": f"sae-lens {versions['sae-lens']}"})
        manifest["fixtures"][name] = {"saelens_class": type(sae).__name__, "architecture": sae.cfg.architecture(),
                                      "call": "forward(x)" if hasattr(sae, "W_skip") else "decode(encode(x))"}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    licence = [f for f in md.distribution("sae-lens").files if f.name.startswith("LICENSE")][0]
    shutil.copy(md.distribution("sae-lens").locate_file(licence), out / "LICENSE")
    return manifest


def compare(new: Path, old: Path) -> list[str]:
    """Mismatches between two fixture trees: SAELens's outputs beyond TOLERANCE, written files not alike."""
    from safetensors.torch import load_file

    problems = []
    for name in FIXTURES:
        if (new / name / "cfg.json").read_text() != (old / name / "cfg.json").read_text():
            problems.append(f"{name}/cfg.json differs")
        for file in (f"{name}/sae_weights.safetensors", f"{name}.saelens.safetensors"):
            a, b = load_file(str(new / file)), load_file(str(old / file))
            if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
                problems.append(f"{file}: tensors differ in names or shapes")
            elif (gap := max(float((a[k] - b[k]).abs().max()) for k in a)) > TOLERANCE:
                problems.append(f"{file}: differs by {gap:.3g}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="regenerate elsewhere and compare; write nothing")
    parser.add_argument("--venv", type=Path, default=VENV, help="SAELens's environment (made if missing)")
    parser.add_argument("--inside", type=Path, help=argparse.SUPPRESS)  # in the venv: SAELens's side
    args = parser.parse_args()
    if args.inside is not None:
        print(json.dumps(saelens_outputs(args.inside)["fixtures"]))
        return
    from reference_venv import build_venv  # beside this script (sys.path[0] when it runs)

    python = build_venv(args.venv, TORCH, PINS)
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "saelens-training"
        target.mkdir()
        write_with_resid(target)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"}
        subprocess.run([str(python), __file__, "--inside", str(target)], check=True, env=env)
        (target / "README.md").write_text(README)
        if args.check:
            if not OUT.exists():
                sys.exit(f"{OUT} does not exist: nothing to check against; run without --check to create it")
            problems = compare(target, OUT)
            for line in problems:
                print("MISMATCH", line)
            print("agrees with" if not problems else "DISAGREES with", OUT)
            sys.exit(1 if problems else 0)
        shutil.rmtree(OUT, ignore_errors=True)
        shutil.copytree(target, OUT)
    print("wrote", OUT)


README = """\
# saelens-training

Dictionaries trained by resid (`resid.analyses.training`) on a synthetic stream, saved in SAELens's format by
`resid.dictionaries.formats.saelens.write`, and what SAELens computes with them after `SAE.load_from_disk`.
Regenerate with `.venv/bin/python tests/data/make_saelens_training_reference.py` (its docstring says how); the test
is `tests/training/test_saelens_loads_resid_files.py`.

- `<name>/cfg.json`, `<name>/sae_weights.safetensors`: written by resid.
- `inputs.safetensors`: the batch `x` [12 16] both libraries encode.
- `<name>.saelens.safetensors`: SAELens's `acts` [12 64] and reconstruction `out` [12 16] (float32).
- `manifest.json`: the versions of sae-lens and torch, and the class SAELens built for each folder.
- `LICENSE`: SAELens's licence (MIT), copied from the installed sae-lens distribution. No SAELens code is here;
  the `.saelens.safetensors` files are SAELens's outputs.
"""


if __name__ == "__main__":
    main()
