"""Regenerate batchtopk-training/, the oracle of tests/training/test_batchtopk_oracle.py: a few training steps of
dictionary_learning's own BatchTopKTrainer (the library resid's batchtopk recipe follows), from its initial weights
on fixed batches, with the losses it returns and the weights and threshold it ends with.

    python tests/data/make_batchtopk_training_reference.py            # build the venv if needed, rewrite
    python tests/data/make_batchtopk_training_reference.py --check    # regenerate elsewhere, compare

The script makes its own virtual environment (build/dictionary-learning-venv: torch==2.13.0 first, so that pip does
not pull a CUDA build, then dictionary-learning==0.1.0, the release on PyPI, less the torchvision its nnsight pulls,
which does not match torch 2.13) and re-runs itself inside it; resid is
never imported, so the steps cannot agree with resid's by construction.

Settings (small, so the fixture is a few kB): d_in 16, 64 features, k 4, STEPS steps of BATCH tokens (inputs: seeded
Gaussian with a non-zero mean, so that b_dec's geometric-median start matters), lr 1e-3 warmed up over WARMUP steps
(dictionary_learning's factor step / warmup_steps, zero at step 0), the threshold tracked from step THRESHOLD_START
+ 1, gradients clipped at 1.0 (BatchTopKTrainer.update always clips). No feature can be dead within these few steps
(10M tokens), so the AuxK term is zero on both sides. Written (float32, safetensors): inputs [STEPS BATCH 16]; the
initial W_enc [16 64], b_enc, W_dec [64 16], b_dec; after each step the loss; after the last the weights and the
threshold.
dictionary_learning's LICENSE (MIT) is copied beside them.
"""

import json
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "batchtopk-training"
VENV = HERE.parents[1] / "build" / "dictionary-learning-venv"
PINS = ["dictionary-learning==0.1.0"]
D_IN, D_SAE, K, STEPS, BATCH, LR, THRESHOLD_START, WARMUP = 16, 64, 4, 6, 64, 1e-3, 2, 2
SETTINGS = dict(d_in=D_IN, d_sae=D_SAE, k=K, steps=STEPS, batch=BATCH, lr=LR, threshold_start_step=THRESHOLD_START,
                warmup_steps=WARMUP, clip=1.0, threshold_beta=0.999, auxk_alpha=1 / 32)
TOLERANCE = 1e-6  # --check: largest |difference|


def generate(out: Path) -> None:
    import importlib.metadata as md

    import torch
    from dictionary_learning.trainers.batch_top_k import BatchTopKTrainer
    from reference_venv import copy_licence
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(STEPS, BATCH, D_IN, generator=generator) * 2 + 0.5 * torch.randn(D_IN, generator=generator)
    trainer = BatchTopKTrainer(steps=STEPS, activation_dim=D_IN, dict_size=D_SAE, k=K, layer=0, lm_name="none", lr=LR,
                               warmup_steps=WARMUP, threshold_start_step=THRESHOLD_START, seed=0, device="cpu")
    ae = trainer.ae
    start = {"W_enc": ae.encoder.weight.T, "b_enc": ae.encoder.bias, "W_dec": ae.decoder.weight.T, "b_dec": ae.b_dec}
    tensors = {f"initial.{k}": v.detach().clone().contiguous() for k, v in start.items()}
    losses = [trainer.update(step, inputs[step]) for step in range(STEPS)]
    end = {"W_enc": ae.encoder.weight.T, "b_enc": ae.encoder.bias, "W_dec": ae.decoder.weight.T, "b_dec": ae.b_dec,
           "threshold": ae.threshold}
    tensors.update({f"final.{k}": v.detach().clone().float().contiguous() for k, v in end.items()})
    tensors.update(inputs=inputs, losses=torch.tensor(losses, dtype=torch.float32))
    source = f"dictionary-learning {md.version('dictionary-learning')}, torch {md.version('torch')}"
    save_file(tensors, str(out / "reference.safetensors"), metadata={"source": source})
    (out / "settings.json").write_text(json.dumps({**SETTINGS, "source": source}, indent=1) + "\n")
    copy_licence("dictionary-learning", out)


def compare(new: Path, old: Path) -> bool:
    from reference_venv import same_tensors

    ok = same_tensors(new / "reference.safetensors", old / "reference.safetensors", TOLERANCE)
    print("agrees with" if ok else "DISAGREES with", old)
    return ok


def main() -> None:
    from reference_venv import main as run  # beside this script (sys.path[0] when it runs)

    run(__file__, __doc__.split("\n")[0], generate, compare, OUT, VENV, PINS, prepare=_without_torchvision)


def _without_torchvision(python: Path) -> None:
    """nnsight (imported by dictionary_learning) pulls a torchvision built for another torch, whose missing operators
    break transformers' imports; nothing here needs it."""
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision"], check=False)


if __name__ == "__main__":
    main()
