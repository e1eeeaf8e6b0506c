"""An attribution graph's backward sweeps in process vs on Ray workers: SmolLM2-135M, the same prompt, the same
random per-layer transcoders (30, of the shapes bench_graphs.py trains: 2x expansion), timed side by side.

    python benchmarks/bench_graph_workers.py [--tokens 16] [--d-sae 1152] [--active 16] [--max-feature-nodes N]
                                             [--batch-size 64] [--workers 2] [--repeats 1]

Cases, each run once first (warm-up), then `--repeats` rounds interleaved:
  inproc_1t   in process, torch.set_num_threads(1)      (the baseline: what one worker does, alone)
  inproc_Nt   in process, N = --workers threads         (every core in process; a loaded machine slows it most)
  ray_Nw      RayExecutor(workers=N), one torch thread each (the driver too: it waits), its actors started (the
              model loaded) before the rounds
Each prints its median wall time and its speed-up over inproc_1t and inproc_Nt, how far its edges are from
inproc_1t's (float32 rounding), and the CPU seconds its last call took in the driver and in each worker (on a
machine whose cores other work shares, the CPU split shows what the wall times cannot: how evenly the work went).
The random transcoders fire about --active features per position and layer (their encoder bias set for that
rate), as a trained BatchTopK k=16 set does, so the graph has as many feature rows as bench_graphs.py's.

What stays serial on workers: the driver's replacement run and replay, each worker's own replacement run (once per
graph, in parallel across workers), the transcoders sent to each worker with each map (job data), the logit rows
before the first max_feature_nodes round and the ranking between rounds; what parallelizes: the feature rows, one
backward sweep per batch, the bulk of a graph's time.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import argparse
import time
from collections.abc import Iterator, Sequence

import torch
from timing import interleaved

import resid
from resid.analyses import Execution, corpus, graphs
from resid.analyses.distributed import Executor, Job, RayExecutor
from resid.dictionaries import Binding, Dictionary, Weights, check


def transcoders(model, d_sae: int, active: int) -> list[Dictionary]:
    """One random ReLU transcoder per layer reading the MLP's standardized input (norm ~ sqrt(d_model)), so that a
    unit-norm encoder column gives pre-activations of about N(0, 1): the bias is the quantile that leaves `active`
    of `d_sae` firing."""
    d = model.config.d_model
    cut = float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(1 - active / d_sae)))
    out = []
    for layer in range(model.config.n_layers):
        g = torch.Generator().manual_seed(layer)
        w_enc = torch.randn(d, d_sae, generator=g)
        weights = Weights(w_enc / w_enc.norm(dim=0, keepdim=True), torch.randn(d_sae, d, generator=g) / d_sae**0.5,
                          torch.zeros(d), torch.full((d_sae,), -cut))
        binding = Binding(f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out")
        out.append(check(Dictionary(weights, binding=binding, name=f"random-transcoder-{layer}"), model))
    return out


class Timed(Executor):
    """Another executor, recording each map's start and when its first and last results arrived (perf_counter)."""

    def __init__(self, inner: Executor):
        self.inner, self.maps = inner, []

    @property
    def workers(self) -> int:
        return self.inner.workers

    def map(self, model, job: Job, chunks: Sequence[object]) -> Iterator[tuple[int, object]]:
        began, arrivals = time.perf_counter(), []
        for index, result in self.inner.map(model, job, chunks):
            arrivals.append(time.perf_counter())
            yield index, result
        self.maps.append((began, arrivals[0], arrivals[-1], len(chunks)))


def threads(n: int, fn):
    def run():
        torch.set_num_threads(n)
        return fn()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16, help="prompt length (a BOS token, then the demo corpus)")
    parser.add_argument("--d-sae", type=int, default=1152)
    parser.add_argument("--active", type=int, default=16, help="features firing per position and layer (about)")
    parser.add_argument("--max-feature-nodes", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-threads", action="store_true", help="leave out inproc_Nt (on a loaded machine its "
                        "threads wait on each other: minutes)")
    args = parser.parse_args()

    model = resid.load("smollm2-135m")
    found = transcoders(model, args.d_sae, args.active)
    text = " ".join(corpus.demo(max_documents=200))
    ids = [model.tokenizer.bos_token_id, *model.tokenizer.encode(text)][:args.tokens]
    n = args.workers
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; SmolLM2-135M, "
          f"{len(ids)} tokens, 30 random transcoders (d_sae {args.d_sae}, ~{args.active} firing), batch "
          f"{args.batch_size}, max_feature_nodes {args.max_feature_nodes}")

    began = time.perf_counter()
    executor = RayExecutor(workers=n)
    startup = executor.start(model)
    print(f"Ray start-up (not in the times below): {time.perf_counter() - began:.1f} s (actors {startup:.1f} s)")
    options = dict(max_feature_nodes=args.max_feature_nodes, skip_bos=True)
    built: dict[str, graphs.Graph] = {}
    timed = Timed(executor)
    spans: dict[str, tuple[float, float]] = {}  # the last call's (start, end)

    cpu: dict[str, list[float]] = {}  # the last call's CPU seconds: the driver's, then each worker's

    def worker_cpu() -> list[float]:
        return executor.ray.get([actor.__ray_call__.remote(lambda self: time.process_time())
                                 for actor in executor.actors])

    def case(name: str, execution: Execution):
        def run():
            remote = name.startswith("ray")
            timed.maps, began, driver, workers = [], time.perf_counter(), time.process_time(), worker_cpu()
            built[name] = graphs.attribute(model, ids, found, **options, execution=execution)
            spans[name] = began, time.perf_counter()
            cpu[name] = [time.process_time() - driver] + ([b - a for a, b in zip(workers, worker_cpu())]
                                                          if remote else [])
        return run

    plain = Execution(batch_size=args.batch_size, progress=False)
    on_ray = Execution(executor=timed, batch_size=args.batch_size, progress=False)
    cases = {"inproc_1t": threads(1, case("inproc_1t", plain)), f"inproc_{n}t": threads(n, case(f"inproc_{n}t", plain)),
             f"ray_{n}w": threads(1, case(f"ray_{n}w", on_ray))}
    if args.no_threads:
        del cases[f"inproc_{n}t"]
    try:
        times = interleaved(cases, args.repeats)
    finally:
        executor.close()
    base, reference = times["inproc_1t"], built["inproc_1t"]
    scale = float(reference.rows.abs().max())
    print(f"graph: {reference.n_features} feature nodes of {len(reference.active_features)} active, "
          f"{reference.n_logits} logits, {reference.n_edges} edges; load after {os.getloadavg()[0]:.2f}")
    for name, seconds in times.items():
        graph = built[name]
        same = torch.equal(graph.features, reference.features)
        diff = float((graph.rows - reference.rows).abs().max()) / scale if same else float("nan")
        threaded = times.get(f"inproc_{n}t", float("nan"))
        print(f"  {name:<10} {seconds:7.2f} s   {base / seconds:5.2f}x inproc_1t  "
              f"{threaded / seconds:5.2f}x inproc_{n}t   same nodes: {same}, "
              f"edges within {diff:.1e} of the largest; CPU s (last call): driver {cpu[name][0]:.1f}"
              + (", workers " + " + ".join(f"{c:.1f}" for c in cpu[name][1:]) if len(cpu[name]) > 1 else ""))
    began, ended = spans[f"ray_{n}w"]
    print(f"ray_{n}w's last call, seconds from its start: " + "; ".join(
        f"map of {chunks} chunks from {start - began:.2f}, first rows {first - began:.2f}, last {last - began:.2f}"
        for start, first, last, chunks in timed.maps) + f"; graph returned {ended - began:.2f}")


if __name__ == "__main__":
    main()
