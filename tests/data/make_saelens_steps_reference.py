"""Regenerate saelens-steps/, the oracle of tests/training/test_saelens_oracle.py: a few training steps of SAELens's
own SAETrainer (SAETrainer.fit, the library's whole step: its training SAE's loss, Adam, gradient clipping at 1.0,
its learning-rate and coefficient schedules) for the recipes resid follows it in, relu (SAELens's "standard") and
jumprelu, from SAELens's initial weights on fixed batches: the losses of each step and the weights it ends with.

    python tests/data/make_saelens_steps_reference.py            # build the venv if needed, rewrite
    python tests/data/make_saelens_steps_reference.py --check    # regenerate elsewhere, compare

The script makes its own virtual environment (build/saelens-steps-venv: torch==2.13.0 first, so that pip does not
pull a CUDA build, then sae-lens==6.54.12, the release tests/data/make_dictionary_reference.py pins) and re-runs
itself inside it; resid is never imported there.

Settings: d_in 16, 64 features, STEPS steps of BATCH tokens (seeded Gaussian inputs with a non-zero mean), lr 1e-3,
warmed up over WARMUP steps (SAELens's LinearLR from 1 / WARMUP) then constant, no activation normalisation, b_dec
as SAELens initialises it (zeros), SAELens's decoder_init_norm 0.1; relu with l1_coefficient 0.5, jumprelu with
SAELens's defaults (l0_coefficient 1, bandwidth 0.05, initial threshold 0.01, "step" sparsity loss). Written per
recipe (float32, safetensors): inputs, initial.*, final.* (W_enc [16 64], b_enc, W_dec [64 16], b_dec, and
jumprelu's threshold) and losses. SAELens's LICENSE (MIT) is tests/data/saelens-training/LICENSE.
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "saelens-steps"
VENV = HERE.parents[1] / "build" / "saelens-steps-venv"
PINS = ["sae-lens==6.54.12"]
D_IN, D_SAE, STEPS, BATCH, LR, WARMUP = 16, 64, 6, 64, 1e-3, 2
RECIPES = {"relu": {"l1_coefficient": 0.5}, "jumprelu": {}}
TOLERANCE = 1e-6  # --check: largest |difference|


def generate(out: Path) -> None:
    import importlib.metadata as md

    import torch
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer
    from safetensors.torch import save_file

    classes = {"relu": (StandardTrainingSAE, StandardTrainingSAEConfig),
               "jumprelu": (JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig)}
    settings = {"d_in": D_IN, "d_sae": D_SAE, "steps": STEPS, "batch": BATCH, "lr": LR, "warmup_steps": WARMUP,
                "recipes": {}}
    for recipe, options in RECIPES.items():
        generator = torch.Generator().manual_seed(3)
        inputs = torch.randn(STEPS, BATCH, D_IN, generator=generator) * 2 + 0.5 * torch.randn(D_IN,
                                                                                           generator=generator)
        torch.manual_seed(0)
        sae_class, config_class = classes[recipe]
        config = config_class(d_in=D_IN, d_sae=D_SAE, dtype="float32", device="cpu", **options)
        sae = sae_class(config)
        names = ["W_enc", "b_enc", "W_dec", "b_dec"] + (["threshold"] if recipe == "jumprelu" else [])
        tensors = {f"initial.{n}": getattr(sae, n).detach().clone().contiguous() for n in names}
        trainer = SAETrainer(SAETrainerConfig(total_training_samples=STEPS * BATCH, train_batch_size_samples=BATCH,
                                              lr=LR, lr_end=LR, lr_warm_up_steps=WARMUP, device="cpu"), sae,
                              iter(list(inputs)))
        losses = []
        step = trainer._train_step

        def recording(sae, sae_in):  # fit() runs the steps; the loss of each is kept as it goes
            output = step(sae, sae_in)
            losses.append(float(output.loss.detach()))
            return output

        trainer._train_step = recording
        trainer.fit()
        tensors.update({f"final.{n}": getattr(sae, n).detach().clone().contiguous() for n in names})
        tensors.update(inputs=inputs, losses=torch.tensor(losses, dtype=torch.float32))
        save_file(tensors, str(out / f"{recipe}.safetensors"))
        settings["recipes"][recipe] = {**{k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str))
                                          and k not in ("dtype", "device")}}
    settings["source"] = f"sae-lens {md.version('sae-lens')}, torch {md.version('torch')}"
    (out / "settings.json").write_text(json.dumps(settings, indent=1) + "\n")


def compare(new: Path, old: Path) -> bool:
    from reference_venv import same_tensors

    ok = True
    for recipe in RECIPES:
        ok = ok and same_tensors(new / f"{recipe}.safetensors", old / f"{recipe}.safetensors", TOLERANCE)
    print("agrees with" if ok else "DISAGREES with", old)
    return ok


def main() -> None:
    from reference_venv import main as run  # beside this script (sys.path[0] when it runs)

    run(__file__, __doc__.split("\n")[0], generate, compare, OUT, VENV, PINS)


if __name__ == "__main__":
    main()
