"""The SAELens peer of bench_train.py: SAELens's own trainer trains its TopK SAE on the activations resid generated.

    build/saelens-reference-venv/bin/python benchmarks/train_saelens.py build/bench-train/acts.safetensors \
        --lr 3.77e-4 --warmup-steps 1 [--expansion 8] [--k 32] [--batch-size 4096] [--device cpu]

Run with the Python of SAELens's environment (tests/data/make_saelens_training_reference.py makes it: torch 2.13.0,
sae-lens 6.54.12), never resid's: this file imports no resid. bench_train.py writes the activations file and runs
this script itself; it holds `train` [steps * batch_size, d_in] (the training tokens, in the order resid trains on
them) and `held_out` [tokens, d_in] (the FVU's tokens), float32.

What runs is SAELens's SAETrainer (sae_lens.training.sae_trainer, the trainer its LanguageModelSAETrainingRunner
calls) with a TopKTrainingSAE at SAELens's TopK defaults (rescale_acts_by_decoder_norm, decoder_init_norm 0.1,
aux loss coefficient 1, its gradient clip at 1.0), Adam at the same learning rate and linear warm-up as resid, no
wandb, no evaluator, no checkpoints, fed the `train` rows batch by batch through its DataProvider interface (an
iterator of tensors). The runner itself is not used: it would make the activations with its own model, read from
the Hugging Face Hub by name (TransformerLens's from_pretrained or transformers' AutoModelForCausalLM), and this
machine has no Hub access (resid's SmolLM2 is a local GGUF file); see bench_train.py.

Prints one JSON line: the training time of fit() (every step, the first included), tokens/s, and the FVU
(sum (x - x^)^2 / sum (x - mean x)^2) and mean L0 of the trained SAE on `held_out`.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TQDM_DISABLE", "1")  # the progress bar's writes are not part of the training's cost
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("acts")
    parser.add_argument("--expansion", type=int, default=8)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import importlib.metadata

    from sae_lens import LoggingConfig, SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig

    tensors = load_file(args.acts)
    train, held_out = tensors["train"].to(args.device), tensors["held_out"].to(args.device)
    d_in, steps = train.shape[1], len(train) // args.batch_size
    torch.manual_seed(args.seed)
    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=args.expansion * d_in, k=args.k, dtype="float32",
                                                device=args.device))
    # lr_end: what SAELens's runner config sets (lr / 10); its constant schedule, the default, ignores it
    cfg = SAETrainerConfig(total_training_samples=steps * args.batch_size, train_batch_size_samples=args.batch_size,
                           lr=args.lr, lr_end=args.lr / 10, lr_warm_up_steps=args.warmup_steps,
                           device=args.device, logger=LoggingConfig(log_to_wandb=False))
    batches = (train[i * args.batch_size:(i + 1) * args.batch_size] for i in range(steps))
    trainer = SAETrainer(cfg, sae, batches)
    _sync(args.device)
    start = time.perf_counter()
    trainer.fit()
    _sync(args.device)
    seconds = time.perf_counter() - start
    sae.eval()
    with torch.no_grad():
        acts = sae.encode(held_out)
        recon = sae.decode(acts)
        fvu = float((held_out - recon).pow(2).sum() / (held_out - held_out.mean(0)).pow(2).sum())
    print(json.dumps({"library": f"sae-lens {importlib.metadata.version('sae-lens')}",
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "steps": steps,
                      "tokens": steps * args.batch_size, "seconds": seconds,
                      "tokens_per_s": steps * args.batch_size / seconds, "fvu": fvu,
                      "l0": float((acts > 0).sum(-1).float().mean())}))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
