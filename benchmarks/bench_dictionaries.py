"""Dictionaries benchmark on SmolLM2-135M (30 layers, d_model 576): one random residual SAE per layer, 16,384
features each, in one process.

    python benchmarks/bench_dictionaries.py [--batch 8] [--pos 64] [--features 16384] [--l0 64] [--repeats 3]
                                            [--dtype fp32|bf16] [--dictionary-dtype model|fp32]

The SAEs are random (W_enc columns and W_dec rows of unit norm, W_dec = W_enc^T) with ReLU encoder biases
calibrated on a separate batch so that each feature fires on about l0 / features of the tokens (about l0 features
per token), read at every layer's hook_resid_post, in the model's dtype (as `dictionary.to(model.dtype)`: a bf16
dictionary's products run in bf16 on a GPU; `--dictionary-dtype fp32` keeps them float32). Timed, interleaved
(benchmarks/timing.py):

    plain      model.run(ids)                                  the default capture (the residual writes)
    observe    model.run(ids, dictionaries=saes)               30 SAEs encoded and decoded at every position,
                                                               activations stored sparse ("auto")
    attribute  features.by_dictionary(model, ids, saes)        every active feature of the 30 SAEs at each
                                                               prompt's last position, with its logit contribution

The issue's targets: observe <= 1.3x plain; attribute <= 1.2x observe. Then the memory of the records: the
activations' bytes with sparse and dense storage, and the peak resident-memory growth of an observe run with each.
"""

import argparse

import torch
from bench_neurons import PeakRSS
from timing import interleaved

import resid
from resid.analyses.features.by_dictionary import by_dictionary
from resid.dictionaries import Binding, Dictionary, Observe, Weights, check


def random_saes(model: resid.Transformer, calibration: torch.Tensor, d_sae: int, l0: int,
                dtype: torch.dtype | None = None) -> list[Dictionary]:
    """One random ReLU SAE per layer on hook_resid_post, each feature firing on about l0 / d_sae of the tokens, on
    the model's device, in `dtype` (default: the model's)."""
    d_model, n_layers = model.config.d_model, model.config.n_layers
    g = torch.Generator().manual_seed(0)
    run = model.run(calibration)
    saes = []
    with torch.no_grad():
        for layer, (_, resid_post) in enumerate(r for r in run.stream.running("layer") if r[0].part == "resid_post"):
            w_enc = torch.randn(d_model, d_sae, generator=g).to(model.device)
            w_enc /= w_enc.norm(dim=0, keepdim=True)
            pre = resid_post.reshape(-1, d_model).float() @ w_enc
            rank = max(1, round(pre.shape[0] * l0 / d_sae))
            b_enc = -pre.topk(rank, dim=0).values[-1]  # the rank-th largest pre-activation of each feature fires
            sae = Dictionary(Weights(w_enc, w_enc.T.contiguous(), torch.zeros(d_model, device=model.device), b_enc),
                             binding=Binding(f"blocks.{layer}.hook_resid_post"), name=f"sae{layer}")
            saes.append(check(sae.to(dtype or model.dtype), model))
    assert len(saes) == n_layers
    return saes


def stored_bytes(run: resid.Run) -> int:
    total = 0
    for encoded in run.dictionaries.values():
        t = encoded.stored
        total += (t.indices().numel() * 8 + t.values().numel() * t.element_size()) if t.is_sparse \
            else t.numel() * t.element_size()
    return total


def saes_dtype(args) -> str:
    return args.dtype if args.dictionary_dtype == "model" else "fp32"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pos", type=int, default=64)
    parser.add_argument("--features", type=int, default=16384)
    parser.add_argument("--l0", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--dictionary-dtype", choices=("model", "fp32"), default="model")
    args = parser.parse_args()
    model = resid.load("smollm2-135m", dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype])
    print(f"SmolLM2-135M on {model.device}, {model.dtype}, torch threads {torch.get_num_threads()}; "
          f"{model.config.n_layers} SAEs ({saes_dtype(args)}) x {args.features} features, "
          f"batch {args.batch} x {args.pos} tokens\n")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.d_vocab, (args.batch, args.pos), generator=g)
    calibration = torch.randint(0, model.config.d_vocab, (args.batch, args.pos), generator=g)
    saes = random_saes(model, calibration, args.features, args.l0,
                       torch.float32 if args.dictionary_dtype == "fp32" else None)

    times = interleaved({
        "plain": lambda: model.run(ids),
        "observe": lambda: model.run(ids, dictionaries=saes),
        "attribute": lambda: by_dictionary(model, ids, saes),
    }, args.repeats)
    for name, seconds in times.items():
        print(f"{name:10s} {seconds * 1000:9.1f} ms")
    print(f"\nobserve / plain      {times['observe'] / times['plain']:.2f}x   (target <= 1.3x)")
    print(f"attribute / observe  {times['attribute'] / times['observe']:.2f}x   (target <= 1.2x)")

    observed = model.run(ids, dictionaries=saes)
    active = sum(int(e.sparse._nnz()) for e in observed.dictionaries.values())
    print(f"\nactive features per token and SAE: {active / (ids.numel() * len(saes)):.1f}")
    rows = by_dictionary(model, ids, saes)
    print(f"attribution rows: {len(rows)} ({int(rows['feature'].notna().sum())} feature rows)")
    del observed
    for storage in ("sparse", "dense"):
        with PeakRSS() as peak:
            run = model.run(ids, dictionaries=[Observe(sae, storage=storage) for sae in saes])
            size = stored_bytes(run)
            del run
        print(f"{storage:6s} activations {size / 2**20:8.1f} MiB stored, peak RSS growth of the run "
              f"{peak.growth / 2**20:8.1f} MiB")


if __name__ == "__main__":
    main()
