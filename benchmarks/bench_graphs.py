"""Attribution graphs on SmolLM2-135M with resid-trained transcoders: resid against circuit-tracer, same model,
same transcoders, same prompts and settings (time, peak memory, node and edge sets).

    python benchmarks/bench_graphs.py [--long 512,1024] [--max-feature-nodes 256] [--batch-size 64]
                                      [--peer-batch-size N] [--no-short] [--no-peer]

1. transcoders  one per layer (30), trained here once with resid.analyses.training (BatchTopK k=16, 2x expansion,
                a short run: this measures speed, not transcoder quality) and kept in build/bench-graphs/
2. resid        graphs.attribute for a 16-token prompt (every active feature) and --long-token prompts (at most
                --max-feature-nodes features, visited by influence as circuit-tracer does), each in a fresh process
                (memory: the growth of the resident set during attribute, sampled every 5 ms by benchmarks/rss.py,
                the same on both sides); position 0's features and errors are constants on both sides (circuit-
                tracer 0.5.0 always zeroes position 0); replacement and completeness scores; the
                intervention check (10 top features ablated in the real model) on the short prompt
3. peer         circuit-tracer's attribute() on the same inputs in its own venv (build/graph-reference-venv, made by
                tests/data/make_graph_reference.py) through benchmarks/graphs_circuit_tracer.py, which builds its
                TransformerLens model from the weights written here; skipped (and said so) when the venv is missing
4. viewer       the short graph's viewer page rendered by headless Chromium to build/bench-graphs/viewer.png when a
                chromium binary is installed

Targets (issue 23): <= 0.5x circuit-tracer's time and <= 0.5x its peak memory at equal node and edge sets.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench-graphs"
PEER_PYTHON = ROOT / "build" / "graph-reference-venv" / "bin" / "python"
SHORT = 16


def transcoders(model):
    """The 30 transcoders, trained once and cached as SAELens folders."""
    import resid.dictionaries
    from resid.analyses import corpus
    from resid.analyses.distributed.execution import Execution
    from resid.analyses.training.loop import Spec, train
    from resid.analyses.training.recipe import Recipe

    folder = WORK / "transcoders-saelens"
    n = model.config.n_layers
    if folder.exists() and len([p for p in folder.iterdir() if p.is_dir()]) == n:
        found = [resid.dictionaries.load(p, model) for p in sorted(folder.iterdir()) if p.is_dir()]
        return sorted(found, key=lambda d: d.point_out.site.layer)
    recipe = Recipe(activation="batchtopk", k=16, expansion=2, steps=24, batch_size=2048, warmup_steps=4,
                    threshold_start_step=8)
    started = time.perf_counter()
    out = train(model, corpus.demo(max_documents=400), [Spec.transcoder(model, l) for l in range(n)], recipe,
                Execution(out=folder, progress=False))
    seconds = time.perf_counter() - started
    print(f"trained {n} transcoders ({recipe.steps * recipe.batch_size} tokens) in {seconds:.0f} s")
    return out


def prompts(model) -> dict[str, list[int]]:
    """Token ids of the demo corpus after the BOS token: circuit-tracer prepends a special token to a prompt that
    does not start with one and zeroes position 0, so both sides get the same ids and resid skips position 0."""
    from resid.analyses import corpus

    text = " ".join(corpus.demo(max_documents=200))
    ids = [model.tokenizer.bos_token_id, *model.tokenizer.encode(text)]
    return {"short": ids[:SHORT], **{f"long{n}": ids[:n] for n in LONG}}


def worker(case: str, settings: dict) -> None:
    """One graph in this process: prints a JSON line with its time, peak memory, sizes and scores."""
    import torch
    from rss import PeakRSS

    import resid
    from resid.analyses import Execution, graphs
    from resid.analyses.graphs.validate import validate

    model = resid.load("smollm2-135m")
    found = transcoders(model)
    ids = settings["prompts"][case]
    limit = None if case == "short" else settings["max_feature_nodes"]
    with PeakRSS() as memory:  # circuit-tracer zeroes position 0 whatever its token: skip_bos=True matches it
        started = time.perf_counter()
        graph = graphs.attribute(model, torch.tensor(ids), found, max_feature_nodes=limit, skip_bos=True,
                                 execution=Execution(batch_size=settings["batch_size"], progress=False))
        seconds = time.perf_counter() - started
    peak = memory.growth
    replacement, completeness = graph.scores()
    report = {"case": case, "seconds": seconds, "peak_bytes": peak, "n_features": graph.n_features,
              "n_active": len(graph.active_features), "n_logits": graph.n_logits, "n_edges": graph.n_edges,
              "replacement": replacement, "completeness": completeness}
    if case == "short":
        check = validate(model, graph, found, top=10)
        report["validation_correlation"] = check["target_logit_correlation"]
        predicted = torch.tensor([row["predicted"] for row in check["features"]])
        measured = torch.tensor([row["measured"] for row in check["features"]])
        report["validation_all_logits"] = float(torch.corrcoef(torch.stack([predicted.flatten(),
                                                                            measured.flatten()]))[0, 1])
        report["validation_scale"] = [float(predicted.abs().median()), float(measured.abs().median())]
        graphs.write_json(graph, WORK / "short.json")
        from resid.analyses.graphs.viewer import write_html
        write_html(graph, WORK / "short.html")
    from safetensors.torch import save_file
    save_file({"rows": graph.rows.contiguous(), "features": graph.features.contiguous(),
               "logit_tokens": graph.logit_tokens.contiguous()}, str(WORK / f"resid_{case}.safetensors"))
    print(json.dumps(report))


def run_worker(command: list[str]) -> dict:
    """The worker's JSON line, or {"failed": why} (a peer killed for memory is a result, not a crash)."""
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode == -9:
        return {"failed": "killed by the kernel (out of memory: the machine has "
                          f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB)"}
    if done.returncode != 0:
        return {"failed": f"exit status {done.returncode}: {done.stderr[-2000:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_peer(case: str, batch_size: int) -> dict:
    """circuit-tracer's graph of `case`; when it runs out of memory, again at half the batch (its memory grows with
    batch x tokens^2, and the graph does not depend on the batch), down to a batch of 1, each failure printed: an
    out-of-memory result is quoted only once no batch fits."""
    while True:
        theirs = run_worker([str(PEER_PYTHON), str(ROOT / "benchmarks" / "graphs_circuit_tracer.py"), str(WORK),
                             case, str(batch_size)])
        memory = "failed" in theirs and ("out of memory" in theirs["failed"] or "OutOfMemory" in theirs["failed"]
                                         or "MemoryError" in theirs["failed"])
        if not memory or batch_size == 1:
            return theirs if not memory else {"failed": f"{theirs['failed']} at every batch down to 1"}
        print(f"{'':>8}  circuit-tracer at batch {batch_size}: {theirs['failed'][:120]}; retrying at "
              f"{batch_size // 2}", flush=True)
        batch_size //= 2


def compare(case: str) -> str:
    """Node and edge sets of the two graphs of `case`: features equal? the edges' errors (edge_errors)."""
    from safetensors.torch import load_file

    ours, theirs = WORK / f"resid_{case}.safetensors", WORK / f"peer_{case}.safetensors"
    if not theirs.exists():
        return "no peer graph to compare"
    a, b = load_file(str(ours)), load_file(str(theirs))
    same_features = a["features"].shape == b["features"].shape and bool((a["features"] == b["features"]).all())
    same_logits = bool((a["logit_tokens"] == b["logit_tokens"]).all()) if a["logit_tokens"].shape == \
        b["logit_tokens"].shape else False
    if not (same_features and same_logits):
        return f"node sets differ (features equal: {same_features}, logits equal: {same_logits})"
    return "equal node sets; " + edge_errors(a["rows"], b["rows"])


def edge_errors(ours, theirs, floor: float = 1e-3) -> str:
    """The edges' agreement told three ways, because one number flatters: max |difference| / max |edge| (the
    README's "within 1e-6 of the largest edge" is this one), the largest per-edge relative error
    among edges above `floor` x max |edge| (below it float32 rounding of the sweeps dominates any relative
    figure), and how many edges are zero on exactly one side (an edge that vanished or appeared)."""
    scale = max(float(theirs.abs().max()), 1e-12)
    diff = (ours - theirs).abs()
    large = theirs.abs() > floor * scale
    per_edge = float((diff[large] / theirs.abs()[large]).max()) if bool(large.any()) else 0.0
    flipped = int(((ours != 0) != (theirs != 0)).sum())
    return (f"max |edge difference| / max |edge| = {float(diff.max()) / scale:.2e}; per-edge relative error above "
            f"{floor:g} x max |edge| ({int(large.sum())} of {int((theirs != 0).sum())} non-zero edges) = "
            f"{per_edge:.2e}; edges zero on one side only: {flipped}")


def screenshot() -> str:
    browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
                   None)
    if browser is None:
        return "no chromium binary installed: viewer not rendered (apt-get install chromium)"
    png = WORK / "viewer.png"
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                           "--window-size=1400,1000", (WORK / "short.html").as_uri()], capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0 or not png.exists():
        return f"chromium failed: {done.stderr[-500:]}"
    return f"viewer rendered by {Path(browser).name}: {png} ({png.stat().st_size} bytes)"


def main() -> None:
    global LONG
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", default="512,1024", help="lengths of the long prompts, comma-separated")
    parser.add_argument("--max-feature-nodes", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--peer-batch-size", type=int, default=None,
                        help="circuit-tracer's batch size when it differs (its memory grows with batch x tokens^2)")
    parser.add_argument("--no-short", action="store_true", help="only the long prompts")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    LONG = [int(n) for n in args.long.split(",")]
    WORK.mkdir(parents=True, exist_ok=True)
    settings_path = WORK / "settings.json"
    if args.worker is not None:
        worker(args.worker, json.loads(settings_path.read_text()))
        return
    from graph_exports import check_roundtrip, write_circuit_tracer_set, write_llama

    import resid

    model = resid.load("smollm2-135m")
    found = transcoders(model)
    write_llama(model, WORK / "model")
    write_circuit_tracer_set(found, WORK / "transcoders")
    assert check_roundtrip(model, found, WORK / "transcoders") == 0.0
    settings = {"prompts": prompts(model), "max_feature_nodes": args.max_feature_nodes,
                "batch_size": args.batch_size, "peer_batch_size": args.peer_batch_size or args.batch_size,
                "max_n_logits": 10, "desired_logit_prob": 0.95}
    settings_path.write_text(json.dumps(settings))
    del model, found
    print(f"SmolLM2-135M, 30 resid-trained transcoders; prompts of {SHORT} and {', '.join(map(str, LONG))} tokens; "
          f"batch {args.batch_size}; long prompts: at most {args.max_feature_nodes} feature nodes")
    peer = PEER_PYTHON.exists() and not args.no_peer
    if args.peer_batch_size:
        print(f"circuit-tracer's batch size: {args.peer_batch_size} (the graph does not depend on it)")
    for case in (*([] if args.no_short else ["short"]), *(f"long{n}" for n in LONG)):
        ours = run_worker([sys.executable, __file__, "--worker", case])
        if "failed" in ours:
            print(f"{case:>8}: resid failed: {ours['failed']}")
            continue
        line = (f"{case:>8}: resid {ours['seconds']:8.1f} s, peak +{ours['peak_bytes'] / 2**30:5.2f} GiB; "
                f"{ours['n_features']} features (of {ours['n_active']} active), {ours['n_edges']} edges; "
                f"replacement {ours['replacement']:.3f}, completeness {ours['completeness']:.3f}")
        if "validation_correlation" in ours:
            line += (f"; intervention check (10 top features ablated): r = {ours['validation_correlation']:.3f} on "
                     f"the target logit, {ours['validation_all_logits']:.3f} on every logit node, median |effect| "
                     f"predicted {ours['validation_scale'][0]:.3f} vs measured {ours['validation_scale'][1]:.3f}")
        print(line)
        if peer:
            theirs = run_peer(case, settings["peer_batch_size"])
            if "failed" in theirs:
                print(f"{'':>8}  circuit-tracer failed: {theirs['failed']}")
                continue
            print(f"{'':>8}  circuit-tracer {theirs['seconds']:8.1f} s, peak +{theirs['peak_bytes'] / 2**30:5.2f} GiB"
                  f" (batch {theirs['batch_size']})"
                  f"  -> time {ours['seconds'] / theirs['seconds']:.2f}x, memory "
                  f"{ours['peak_bytes'] / theirs['peak_bytes']:.2f}x (targets <= 0.5x); {compare(case)}")
    if not peer:
        print("circuit-tracer not run: " + ("--no-peer" if args.no_peer else f"{PEER_PYTHON} is missing (python "
                                            "tests/data/make_graph_reference.py builds it)"))
    print(screenshot())


LONG = [512, 1024]

if __name__ == "__main__":
    main()
