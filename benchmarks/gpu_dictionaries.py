"""The dictionary workloads of bench_gpu.py (issues 21-23 on a GPU): records as in gpu_workloads.py.

  dictionaries  30 random residual SAEs (bench_dictionaries.random_saes, in the model's dtype: a bf16 model's are
                bf16, whose products run in bf16) observed in a forward and their features attributed, against the
                plain forward (the dictionaries issue's targets: observe <= 1.3x the multiply-add bound, about 3.1x
                plain with the 30 encoders; attribute <= 1.2x observe)
  training      30 BatchTopK transcoders (k=16, 2x) trained together from one forward stream of the demo corpus
                (resid.analyses.training.train, no files written): tokens/s, generation included
  graph         an attribution graph (resid.analyses.graphs.attribute) through those transcoders on a prompt of the
                demo corpus; they are trained briefly, which measures speed, not graph quality
"""

import time

import torch
from bench_dictionaries import random_saes
from gpu_timing import Peak, interleaved, sync

from resid.analyses import Execution, corpus, graphs
from resid.analyses.features.by_dictionary import by_dictionary


def observe(model, batch: int, pos: int, d_sae: int, l0: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.d_vocab, (batch, pos), generator=g).to(model.device)
    calibration = torch.randint(0, model.config.d_vocab, (batch, pos), generator=g).to(model.device)
    saes = random_saes(model, calibration, d_sae, l0)
    measured = interleaved({
        "plain": lambda: model.run(ids),
        "observe": lambda: model.run(ids, dictionaries=saes),
        "attribute": lambda: by_dictionary(model, ids, saes),
    }, repeats, model.device)
    seconds = {name: m[0] if isinstance(m, tuple) else m for name, m in measured.items()}
    out = dict(workload="dictionaries", saes=len(saes), features=d_sae, tokens=f"{batch}x{pos}", seconds=seconds,
               peak_bytes={name: m[1] if isinstance(m, tuple) else m for name, m in measured.items()})
    if all(isinstance(s, float) for s in seconds.values()):
        out.update(observe_over_plain=seconds["observe"] / seconds["plain"],
                   attribute_over_observe=seconds["attribute"] / seconds["observe"])
    return out


def train_transcoders(model, steps: int, batch_size: int, forward_batch: int, buffer_tokens: int
                      ) -> tuple[dict, list]:
    from resid.analyses.distributed.execution import Execution
    from resid.analyses.training.loop import Spec, train
    from resid.analyses.training.recipe import Recipe

    recipe = Recipe(activation="batchtopk", k=16, expansion=2, steps=steps, batch_size=batch_size,
                    warmup_steps=max(1, steps // 6), threshold_start_step=max(1, steps // 3))
    specs = [Spec.transcoder(model, layer) for layer in range(model.config.n_layers)]
    texts = corpus.demo(max_documents=2000)
    with Peak(model.device) as peak:
        start = time.perf_counter()
        found = train(model, texts, specs, recipe, Execution(batch_size=forward_batch, progress=False),
                      buffer_tokens=buffer_tokens, device=model.device)
        sync(model.device)
        seconds = time.perf_counter() - start
    tokens = steps * batch_size
    return dict(workload="training", dictionaries=len(found), tokens=tokens, seconds=seconds,
                tokens_per_s=tokens / seconds, peak_bytes=peak.bytes), found


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

