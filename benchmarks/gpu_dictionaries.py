"""The dictionary workloads of bench_gpu.py (issues 21-23 on a GPU): records as in gpu_workloads.py.

  dictionaries  30 random residual SAEs (bench_dictionaries.random_saes, in the model's dtype: a bf16 model's are
                bf16, whose products run in bf16) observed in a forward and their features attributed, against the
                plain forward. Observing cannot beat its multiply-add bound: the plain forward plus the encoders
                (tokens x SAEs x d_model x features, ~2.1x SmolLM2's own multiply-adds at 8x512 and 16k features),
                bound_ratio = 1 + encoders / forward; targets: observe <= 1.3x that bound (observe_over_bound),
                attribute <= 1.2x observe
  training      30 BatchTopK transcoders (k=16, 2x) trained together from one forward stream of the demo corpus
                (resid.analyses.training.train, no files written): tokens/s, generation included
  clt           the optimizer steps alone of a cross-layer transcoder and of one per-layer transcoder per layer
                (BatchTopK, k=16) on synthetic batches of the model's shapes, as benchmarks/bench_clt.py on the
                CPU: tokens/s and the share of the FLOP bound (transcoder_flops at this device's dense matmul rate,
                gpu_timing.matmul_flops; Adam's update of every weight is not part of the bound); target: the CLT
                at >= 45%
  graph         an attribution graph (resid.analyses.graphs.attribute) through those transcoders on a prompt of the
                demo corpus; they are trained briefly, which measures speed, not graph quality
"""

import statistics
import time

import torch
from bench_dictionaries import random_saes
from gpu_profile import Profiles
from gpu_timing import Peak, interleaved, matmul_flops, sync
from gpu_workloads import forward_macs

from resid.analyses import Execution, corpus, graphs
from resid.analyses.features.by_dictionary import by_dictionary
from resid.analyses.training.crosslayer import CrossLayerCoder
from resid.analyses.training.loop import Spec, train
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Trainer


def observe(model, batch: int, pos: int, d_sae: int, l0: int, repeats: int, profiles: Profiles | None = None
            ) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.d_vocab, (batch, pos), generator=g).to(model.device)
    calibration = torch.randint(0, model.config.d_vocab, (batch, pos), generator=g).to(model.device)
    saes = random_saes(model, calibration, d_sae, l0)
    cases = {
        "plain": lambda: model.run(ids),
        "observe": lambda: model.run(ids, dictionaries=saes),
        "attribute": lambda: by_dictionary(model, ids, saes),
    }
    measured = interleaved(cases, repeats, model.device)
    seconds = {name: m[0] if isinstance(m, tuple) else m for name, m in measured.items()}
    encoders = batch * pos * sum(d.d_in * d.d_sae for d in saes)
    out = dict(workload="dictionaries", saes=len(saes), features=d_sae, tokens=f"{batch}x{pos}", seconds=seconds,
               peak_bytes={name: m[1] if isinstance(m, tuple) else m for name, m in measured.items()},
               bound_ratio=1 + encoders / forward_macs(model.config, batch, pos))
    if all(isinstance(s, float) for s in seconds.values()):
        out.update(observe_over_plain=seconds["observe"] / seconds["plain"],
                   observe_over_bound=seconds["observe"] / seconds["plain"] / out["bound_ratio"],
                   attribute_over_observe=seconds["attribute"] / seconds["observe"])
    if profiles is not None:
        for name, fn in cases.items():
            profiles.later(f"dictionaries {name}", fn)
    return out


def train_transcoders(model, steps: int, batch_size: int, forward_batch: int, buffer_tokens: int,
                      profiles: Profiles | None = None) -> tuple[dict, list]:
    """The record and the trained transcoders; `profiles`: a separate short run (4 steps) to profile."""
    specs = [Spec.transcoder(model, layer) for layer in range(model.config.n_layers)]
    texts = corpus.demo(max_documents=2000)

    def run(steps: int, buffer_tokens: int) -> list:
        recipe = Recipe(activation="batchtopk", k=16, expansion=2, steps=steps, batch_size=batch_size,
                        warmup_steps=max(1, steps // 6), threshold_start_step=max(1, steps // 3))
        return train(model, texts, specs, recipe, Execution(batch_size=forward_batch, progress=False,
                                                            device=model.device), buffer_tokens=buffer_tokens)

    with Peak(model.device) as peak:
        start = time.perf_counter()
        found = run(steps, buffer_tokens)
        sync(model.device)
        seconds = time.perf_counter() - start
    tokens = steps * batch_size
    out = dict(workload="training", dictionaries=len(found), tokens=tokens, seconds=seconds,
               tokens_per_s=tokens / seconds, peak_bytes=peak.bytes)
    if profiles is not None:
        profiles.later("training 4 steps", lambda: run(4, min(buffer_tokens, 4 * batch_size)), grad=True)
    return out, found


def transcoder_flops(kind: str, tokens: int, n_layers: int, d_in: int, d_out: int, d_sae: int, k: int) -> float:
    """FLOPs of one training step of `tokens` rows, forward and the two backward products (3x the forward's
    multiply-adds, 2 FLOPs each), as benchmarks/bench_clt.py counts them: the encoders (tokens x layers x d_in x
    d_sae, both kinds) and the decoders reading only the k kept rows per token and source layer (per-layer: into
    its own layer; clt: into that layer and every later one, n (n + 1) / 2 blocks)."""
    encoders = tokens * n_layers * d_in * d_sae
    blocks = n_layers if kind in ("per-layer", "skip") else n_layers * (n_layers + 1) // 2
    skip = tokens * n_layers * d_in * d_out if kind == "skip" else 0
    return 2 * 3 * (encoders + tokens * k * d_out * blocks + skip)


def clt_steps(model, batch_size: int, d_sae: int, k: int, steps: int, profiles: Profiles | None = None) -> list:
    """The clt workload (module docstring): per kind the median step time over `steps` interleaved rounds after
    one warm-up round, on Gaussian batches [batch_size layer d_model] in the model's dtype."""
    device, config = model.device, model.config
    n, d = config.n_layers, config.d_model
    recipe = Recipe(activation="batchtopk", k=k, d_sae=d_sae, batch_size=batch_size, steps=steps + 2,
                    warmup_steps=0, normalize="none")
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(batch_size, n, d, generator=g).to(device, model.dtype) for _ in range(2))
    per_layer = [Trainer.new(recipe, d, d, transcoder=True, device=device) for _ in range(n)]
    clt = Trainer(CrossLayerCoder(n, d, d, recipe), device)
    cases = {"per-layer": lambda: [t.step(x[:, layer], y[:, layer]) for layer, t in enumerate(per_layer)],
             "clt": lambda: clt.step(x, y)}
    rate = matmul_flops(device)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(steps + 1):
        for name, fn in cases.items():
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            if round_:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    records = []
    for name, fn in cases.items():
        seconds = statistics.median(times[name])
        bound = transcoder_flops(name, batch_size, n, d, d, d_sae, k) / rate
        record = dict(workload=f"{name} transcoder steps", layers=n, features=d_sae, k=k, batch=batch_size,
                      seconds=seconds, tokens_per_s=batch_size / seconds, matmul_tflops=rate / 1e12,
                      flop_bound_s=bound, flop_fraction=bound / seconds,
                      weights=sum(p.numel() for t in (per_layer if name == "per-layer" else [clt])
                                  for p in t.coder.parameters()))
        if profiles is not None:
            profiles.later(f"{name} transcoder step", fn, grad=True)
        records.append(record)
    return records


def graph(model, transcoders: list, n_tokens: int, max_feature_nodes: int | None, batch_size: int) -> dict:
    text = " ".join(corpus.demo(max_documents=50))
    bos = model.tokenizer.bos_token_id
    ids = ([bos] if bos is not None else []) + model.tokenizer.encode(text)
    ids = torch.tensor(ids[:n_tokens])
    with Peak(model.device) as peak:
        start = time.perf_counter()
        result = graphs.attribute(model, ids, transcoders, max_feature_nodes=max_feature_nodes,
                                  execution=Execution(batch_size=batch_size))
        sync(model.device)
        seconds = time.perf_counter() - start
    replacement, completeness = result.scores()
    return dict(workload="graph", tokens=n_tokens, seconds=seconds, features=result.n_features,
                active=len(result.active_features), edges=result.n_edges, replacement=replacement,
                completeness=completeness, peak_bytes=peak.bytes)

