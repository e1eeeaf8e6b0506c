"""Long prompts on SmolLM2-135M: attribution graphs at thousands of tokens, exact head patching and AtP over every
head, each workload's time and peak memory in one table.

    python benchmarks/bench_long_prompts.py [--graph 2048,4096] [--patching 2048] [--max-feature-nodes 256]
                                            [--batch-size 32] [--heads 36]

1. graph     graphs.attribute on the first N tokens of the demo corpus (BOS first, skip_bos as bench_graphs.py),
             with the 30 transcoders bench_graphs.py trains once and keeps in build/bench-graphs/, at most
             --max-feature-nodes features visited by influence; the replacement check
             (metadata["replacement_logit_error"]) printed beside it
2. patching  patching.activation of the last --heads heads (sites "head" of the top layers, every position) on a
             (clean, corrupt) pair of N tokens (the corrupt prompt: the clean one with one token near its end
             replaced), metric the clean next token's probability
3. atp       patching.atp of every head on the same pair (one forward of each prompt, one backward)

Each workload runs in a fresh process (memory: the growth of the resident set during the call, sampled every 5 ms
by benchmarks/rss.py, beside the process's whole peak, ru_maxrss). Seconds are wall time on this machine; with
other work on its cores they are upper bounds.
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench-graphs"  # bench_graphs.py's: the transcoders are trained there once
CORRUPTED = 8  # the corrupt prompt's replaced token: this many positions before the end


def corpus_ids(model, n: int) -> list[int]:
    """BOS and the first n - 1 tokens of the demo corpus."""
    from resid.analyses import corpus

    text = " ".join(corpus.demo(max_documents=400))
    ids = [model.tokenizer.bos_token_id, *model.tokenizer.encode(text)]
    if len(ids) < n:
        raise SystemExit(f"the demo corpus has {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def pair(model, n: int) -> tuple[str, str, str]:
    """(clean text, corrupt text, the clean prompt's next token): texts of n tokens each (BOS excluded: the
    tokenizer adds what the model expects), the same length after tokenizing again."""
    tok = model.tokenizer
    ids = corpus_ids(model, n + 1)[1:]
    clean_ids, target = ids[:-1], ids[-1]
    clean = tok.decode(clean_ids)
    for offset in range(CORRUPTED, 64):
        swapped = list(clean_ids)
        swapped[-offset] = tok.encode(" blue")[0] if swapped[-offset] != tok.encode(" blue")[0] else tok.encode(
            " red")[0]
        corrupt = tok.decode(swapped)
        if len(model.as_tokens([clean]).ids[0]) == len(model.as_tokens([corrupt]).ids[0]):
            return clean, corrupt, tok.decode([target])
    raise SystemExit("no single-token corruption keeps the prompt's length")


def worker(workload: str, n: int, settings: dict) -> dict:
    """One workload in this process: its seconds, peak memory and sizes."""
    import torch
    from bench_graphs import transcoders
    from rss import PeakRSS

    import resid
    from resid.analyses import Execution, graphs, patching
    from resid.sites import Site

    torch.manual_seed(0)
    model = resid.load("smollm2-135m")
    report: dict = {"workload": workload, "tokens": n}
    if workload == "graph":
        found = transcoders(model)
        ids = torch.tensor(corpus_ids(model, n))
        with PeakRSS() as memory:
            started = time.perf_counter()
            graph = graphs.attribute(model, ids, found, max_feature_nodes=settings["max_feature_nodes"],
                                     skip_bos=True, execution=Execution(batch_size=settings["batch_size"],
                                                                        progress=False))
            seconds = time.perf_counter() - started
        report.update(active=len(graph.active_features), visited=graph.n_features,
                      check=graph.metadata["replacement_logit_error"])
    else:
        clean, corrupt, target = pair(model, n)
        config = model.config
        with PeakRSS() as memory:
            started = time.perf_counter()
            if workload == "patching":
                layers = range(config.n_layers - -(-settings["heads"] // config.n_heads), config.n_layers)
                heads = [Site(l, "attn", head=h) for l in layers for h in range(config.n_heads)][-settings["heads"]:]
                frame = patching.activation(model, [clean], [corrupt], [target], sites=heads,
                                            execution=Execution(batch_size=1, progress=False))
            else:
                frame = patching.atp(model, [clean], [corrupt], [target], sites="head",
                                     execution=Execution(progress=False))
            seconds = time.perf_counter() - started
        report.update(sites=len(frame), mean_abs_score=float(frame["score"].abs().mean()))
    report.update(seconds=seconds, peak_bytes=memory.growth,
                  maxrss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return report


def run_worker(workload: str, n: int) -> dict:
    command = [sys.executable, __file__, "--worker", f"{workload}:{n}"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        why = "killed (out of memory?)" if done.returncode == -9 else f"exit status {done.returncode}"
        return {"workload": workload, "tokens": n, "failed": f"{why}: {done.stderr[-1500:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def line(r: dict) -> str:
    head = f"{r['tokens']:>6}  {r['workload']:<9}"
    if "failed" in r:
        return f"{head} failed: {r['failed']}"
    if r["workload"] == "graph":
        what = f"{r['active']:>9} {r['visited']:>8}   replacement check {r['check']:.1e}"
    else:
        what = f"{'':>9} {'':>8}   {r['sites']} sites, mean |score| {r['mean_abs_score']:.3f}"
    return (f"{head} {r['seconds']:>8.1f} {r['peak_bytes'] / 2**30:>9.2f} {r['maxrss_bytes'] / 2**30:>8.2f} "
            f"{what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="2048,4096", help="graph prompt lengths, comma-separated ('' for none)")
    parser.add_argument("--patching", default="2048", help="patching / AtP prompt lengths ('' for none)")
    parser.add_argument("--max-feature-nodes", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="graph targets per backward sweep")
    parser.add_argument("--heads", type=int, default=36, help="heads patched exactly (the top layers' last heads)")
    parser.add_argument("--no-atp", action="store_true")
    parser.add_argument("--no-exact", action="store_true")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    settings_path = WORK / "long-settings.json"
    if args.worker is not None:
        workload, n = args.worker.split(":")
        print(json.dumps(worker(workload, int(n), json.loads(settings_path.read_text()))))
        return
    WORK.mkdir(parents=True, exist_ok=True)
    settings_path.write_text(json.dumps({"max_feature_nodes": args.max_feature_nodes,
                                         "batch_size": args.batch_size, "heads": args.heads}))
    lengths = [int(n) for n in args.graph.split(",") if n]
    pairs = [int(n) for n in args.patching.split(",") if n]
    work = [("graph", n) for n in lengths]
    work += [("patching", n) for n in pairs if not args.no_exact] + [("atp", n) for n in pairs if not args.no_atp]
    print(f"SmolLM2-135M; graphs: at most {args.max_feature_nodes} feature nodes, {args.batch_size} targets per "
          f"sweep; patching: {args.heads} heads exactly; AtP: every head")
    print(f"{'tokens':>6}  {'workload':<9} {'seconds':>8} {'peak GiB':>9} {'maxrss':>8} {'active':>9} {'visited':>8}")
    for workload, n in work:
        print(line(run_worker(workload, n)), flush=True)


if __name__ == "__main__":
    main()
