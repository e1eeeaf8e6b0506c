"""The SAELens peer of bench_train.py: SAELens's own trainer trains its TopK SAE on the activations resid generated.

    build/saelens-reference-venv/bin/python benchmarks/train_saelens.py build/bench-train/acts.safetensors \
        --lr 3e-4 --warmup-steps 0 [--expansion 8] [--k 32] [--batch-size 4096] [--device cpu] [--fvu-every N]

Run with the Python of SAELens's environment (tests/data/make_saelens_training_reference.py makes it: torch 2.13.0,
sae-lens 6.54.12), never resid's: this file imports no resid. bench_train.py writes the activations file and runs
this script itself; it holds `train` [steps * batch_size, d_in] (the training tokens, in the order resid trains on
them) and `held_out` [tokens, d_in] (the FVU's tokens), float32.

Two modes, each training SAELens's TopK SAE at SAELens's TopK defaults (rescale_acts_by_decoder_norm,
decoder_init_norm 0.1, aux loss coefficient 1, its gradient clip at 1.0) with Adam at the learning rate and
warm-up bench_train.py passes, no wandb, no evaluator, no checkpoints:

- trainer (default): SAELens's SAETrainer (sae_lens.training.sae_trainer, the trainer its runner calls) fed the
  `train` rows batch by batch through its DataProvider interface (an iterator of tensors): the same tokens in the
  same order as resid's trainer.
- --gguf FILE --tokenizer DIR --texts FILE --steps N: end to end, SAELens's LanguageModelSAETrainingRunner making
  its own activations. Its model is what SAELens's load_model("AutoModelForCausalLM", ...) would build, a
  HookedProxyLM over a transformers model, but handed in (override_model) because load_model reads the model by
  Hub name and this machine has no Hub access: transformers loads the GGUF file resid loads (the same dequantized
  weights), and the tokenizer is the committed tests/data/smollm2-135m one. The corpus (a JSON list of documents,
  the ones resid reads) is handed in as an in-memory datasets.Dataset (override_dataset); SAELens tokenizes and
  packs it into context_size sequences (BOS between documents; special tokens excluded from training, as resid
  drops BOS). The hook is model.layers.15, whose output is resid's blocks.15.hook_resid_post.

Prints one JSON line: the time of fit() (every step, the first included) or of the runner (its set-up and run,
not the model's loading), tokens/s of the trained tokens, and the FVU
(sum (x - x^)^2 / sum (x - mean x)^2) and mean L0 of the trained SAE on `held_out`.
"""

import argparse
import importlib.metadata
import json
import os
import time
from pathlib import Path

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
    parser.add_argument("--gguf", type=Path, help="end to end: SmolLM2's GGUF file")
    parser.add_argument("--tokenizer", type=Path, help="end to end: a folder with tokenizer.json")
    parser.add_argument("--texts", type=Path, help="end to end: the corpus, a JSON list of documents")
    parser.add_argument("--steps", type=int, help="end to end: training steps")
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument("--context-size", type=int, default=256)
    parser.add_argument("--store-batch-prompts", type=int, default=8)
    parser.add_argument("--autocast", action="store_true", help="end to end: autocast_lm (the model in bf16 autocast)")
    parser.add_argument("--batches-in-buffer", type=int, default=20, help="SAELens's n_batches_in_buffer")
    parser.add_argument("--fvu-every", type=int, default=0,
                        help="trainer mode: the held-out FVU every this many steps too (its time not counted)")
    args = parser.parse_args()

    from sae_lens import TopKTrainingSAEConfig

    tensors = load_file(args.acts)
    held_out = tensors["held_out"].to(args.device)
    d_in = held_out.shape[1]
    torch.manual_seed(args.seed)
    sae_cfg = TopKTrainingSAEConfig(d_in=d_in, d_sae=args.expansion * d_in, k=args.k, dtype="float32",
                                    device=args.device)
    curve = []  # (tokens trained, held-out FVU) along training
    if args.gguf is not None:
        steps, seconds, sae = _end_to_end(args, sae_cfg)
    else:
        steps, seconds, sae = _trainer(args, sae_cfg, tensors["train"].to(args.device), held_out, curve)
    sae.eval()
    fvu, acts = _fvu(sae, held_out)
    curve.append((steps * args.batch_size, fvu))
    print(json.dumps({"curve": curve, "library": f"sae-lens {importlib.metadata.version('sae-lens')}",
                      "mode": "end to end" if args.gguf is not None else "trainer",
                      "torch": torch.__version__, "threads": torch.get_num_threads(), "steps": steps,
                      "tokens": steps * args.batch_size, "seconds": seconds,
                      "tokens_per_s": steps * args.batch_size / seconds, "fvu": fvu,
                      "l0": float((acts > 0).sum(-1).float().mean())}))


def _fvu(sae, rows: torch.Tensor) -> tuple[float, torch.Tensor]:
    """sum (x - x^)^2 / sum (x - mean x)^2 on `rows`, and the SAE's activations there."""
    with torch.no_grad():
        acts = sae.encode(rows)
        recon = sae.decode(acts)
    return float((rows - recon).pow(2).sum() / (rows - rows.mean(0)).pow(2).sum()), acts


def _trainer(args, sae_cfg, train: torch.Tensor, held_out: torch.Tensor, curve: list):
    """SAELens's SAETrainer on the given rows: (steps, seconds, the trained SAE). With --fvu-every, the held-out
    FVU is appended to `curve` when the trainer asks for batch i (i steps done), its time taken out of `seconds`."""
    from sae_lens import LoggingConfig, SAETrainer, TopKTrainingSAE
    from sae_lens.config import SAETrainerConfig

    steps = len(train) // args.batch_size
    sae = TopKTrainingSAE(sae_cfg)
    # lr_end: what SAELens's runner config sets (lr / 10); its constant schedule, the default, ignores it
    cfg = SAETrainerConfig(total_training_samples=steps * args.batch_size, train_batch_size_samples=args.batch_size,
                           lr=args.lr, lr_end=args.lr / 10, lr_warm_up_steps=args.warmup_steps,
                           device=args.device, logger=LoggingConfig(log_to_wandb=False))
    evaluating = [0.0]

    def batches():
        for i in range(steps):
            if args.fvu_every and i and i % args.fvu_every == 0:
                _sync(args.device)
                start = time.perf_counter()
                curve.append((i * args.batch_size, _fvu(sae, held_out)[0]))
                evaluating[0] += time.perf_counter() - start
            yield train[i * args.batch_size:(i + 1) * args.batch_size]

    trainer = SAETrainer(cfg, sae, batches())
    _sync(args.device)
    start = time.perf_counter()
    trainer.fit()
    _sync(args.device)
    return steps, time.perf_counter() - start - evaluating[0], sae


def _end_to_end(args, sae_cfg):
    """SAELens's LanguageModelSAETrainingRunner on SmolLM2 and the corpus: (steps, seconds, the trained SAE)."""
    from datasets import Dataset
    from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, LoggingConfig
    from sae_lens.load_model import HookedProxyLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hook = f"model.layers.{args.layer}"
    hf = AutoModelForCausalLM.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name,
                                              dtype=torch.float32).to(args.device).eval()
    model = HookedProxyLM(hf, AutoTokenizer.from_pretrained(str(args.tokenizer)), hook_names=[hook])
    texts = Dataset.from_dict({"text": json.loads(args.texts.read_text())})
    cfg = LanguageModelSAERunnerConfig(
        sae=sae_cfg, model_name="HuggingFaceTB/SmolLM2-135M", model_class_name="AutoModelForCausalLM",
        hook_name=hook, dataset_path="resid-demo-corpus", is_dataset_tokenized=False, streaming=False,
        context_size=args.context_size, store_batch_size_prompts=args.store_batch_prompts,
        n_batches_in_buffer=args.batches_in_buffer,
        training_tokens=args.steps * args.batch_size, train_batch_size_tokens=args.batch_size,
        exclude_special_tokens=True, autocast_lm=args.autocast, lr=args.lr, lr_warm_up_steps=args.warmup_steps,
        device=args.device,
        seed=args.seed, logger=LoggingConfig(log_to_wandb=False), checkpoint_path=None, output_path=None,
        verbose=False,
    )
    _sync(args.device)
    start = time.perf_counter()
    runner = LanguageModelSAETrainingRunner(cfg, override_dataset=texts, override_model=model)
    sae = runner.run()
    _sync(args.device)
    return args.steps, time.perf_counter() - start, sae


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
