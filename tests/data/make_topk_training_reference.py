"""Regenerate topk-training/, the oracle of tests/training/test_topk_oracle.py: a few training steps of sparsify's
own SparseCoder (EleutherAI's sparsify, the library resid's topk recipe follows), from its initial weights on fixed
batches, with the losses and the weights it ends with.

    python tests/data/make_topk_training_reference.py            # build the venv if needed, rewrite
    python tests/data/make_topk_training_reference.py --check    # regenerate elsewhere, compare

The script makes its own virtual environment (build/sparsify-venv: torch==2.13.0 first, so that pip does not pull a
CUDA build, then eai-sparsify==1.3.3) and re-runs itself inside it; resid is never imported there.

sparsify's Trainer needs a model and a dataset, so the loop here is its Trainer.fit's, step for step, around the
library's own pieces (sparsify/trainer.py, optimizer="adam"): at step 0 b_dec is the batch mean; before each forward
SparseCoder.set_decoder_norm_to_unit_norm(); loss = fvu + auxk_alpha * auxk_loss from SparseCoder.forward (its FVU and
AuxK); backward; SparseCoder.remove_gradient_parallel_to_decoder_directions(); torch.optim.Adam (sparsify's betas,
the defaults) with transformers' get_linear_schedule_with_warmup(adam, WARMUP, STEPS), sparsify's schedule (its
factor is step / warmup while warming up, zero at step 0, then falls linearly to 0). The decoder rows are normed
once more after the last step, as the next step would. No feature is dead within a few steps, so AuxK is zero.
Written (float32, safetensors): inputs [STEPS BATCH 16], the initial W_enc [16 64], b_enc, W_dec [64 16], b_dec, the
loss of each step, the final weights. sparsify's LICENSE (MIT) is copied beside them.
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "topk-training"
VENV = HERE.parents[1] / "build" / "sparsify-venv"
PINS = ["eai-sparsify==1.3.3"]
D_IN, D_SAE, K, STEPS, BATCH, LR, WARMUP = 16, 64, 4, 6, 64, 1e-3, 2
SETTINGS = dict(d_in=D_IN, d_sae=D_SAE, k=K, steps=STEPS, batch=BATCH, lr=LR, warmup_steps=WARMUP,
                decay_steps=STEPS - WARMUP,
                auxk_alpha=1 / 32)
TOLERANCE = 1e-6  # --check: largest |difference|


def generate(out: Path) -> None:
    import importlib.metadata as md

    import torch
    from reference_venv import copy_licence
    from safetensors.torch import save_file
    from sparsify import SparseCoder, SparseCoderConfig
    from transformers import get_linear_schedule_with_warmup

    generator = torch.Generator().manual_seed(2)
    inputs = torch.randn(STEPS, BATCH, D_IN, generator=generator) * 2 + 0.5 * torch.randn(D_IN, generator=generator)
    torch.manual_seed(0)
    sae = SparseCoder(D_IN, SparseCoderConfig(k=K, num_latents=D_SAE), device="cpu")
    names = {"W_enc": lambda: sae.encoder.weight.T, "b_enc": lambda: sae.encoder.bias, "W_dec": lambda: sae.W_dec,
             "b_dec": lambda: sae.b_dec}
    tensors = {f"initial.{k}": v().detach().clone().contiguous() for k, v in names.items()}
    adam = torch.optim.Adam(sae.parameters(), lr=LR)
    schedule = get_linear_schedule_with_warmup(adam, WARMUP, STEPS)
    losses = []
    for step, x in enumerate(inputs):
        if step == 0:
            sae.b_dec.data = x.mean(0)
        sae.set_decoder_norm_to_unit_norm()
        out_ = sae(x, dead_mask=None)
        loss = out_.fvu + SETTINGS["auxk_alpha"] * out_.auxk_loss
        loss.backward()
        sae.remove_gradient_parallel_to_decoder_directions()
        adam.step()
        adam.zero_grad()
        schedule.step()
        losses.append(float(loss))
    sae.set_decoder_norm_to_unit_norm()
    tensors.update({f"final.{k}": v().detach().clone().contiguous() for k, v in names.items()})
    tensors.update(inputs=inputs, losses=torch.tensor(losses, dtype=torch.float32))
    source = f"eai-sparsify {md.version('eai-sparsify')}, transformers {md.version('transformers')}, torch " \
             f"{md.version('torch')}"
    save_file(tensors, str(out / "reference.safetensors"), metadata={"source": source})
    (out / "settings.json").write_text(json.dumps({**SETTINGS, "source": source}, indent=1) + "\n")
    copy_licence("eai-sparsify", out)


def compare(new: Path, old: Path) -> bool:
    from reference_venv import same_tensors

    ok = same_tensors(new / "reference.safetensors", old / "reference.safetensors", TOLERANCE)
    print("agrees with" if ok else "DISAGREES with", old)
    return ok


def main() -> None:
    from reference_venv import main as run  # beside this script (sys.path[0] when it runs)

    run(__file__, __doc__.split("\n")[0], generate, compare, OUT, VENV, PINS)


if __name__ == "__main__":
    main()
