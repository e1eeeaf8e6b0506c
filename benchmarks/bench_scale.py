"""Research-size models within 24 GB: a Llama-3.1-8B-shaped model with random bfloat16 weights, in resid and in
transformers (each in a process of its own), time and peak resident memory per workload (issue 41).

    python benchmarks/bench_scale.py [--shape 8b|1b] [--folder DIR] [--tokens 128] [--pairs 8] [--heads 24]
                                     [--graph-tokens 32] [--width 512] [--max-feature-nodes 128]
                                     [--workloads decomposition,ablation,patching,atp,graph] [--no-peer] [--out J]

1. weights  written once into --folder (default build/scale/llama-<shape>; kept): config.json,
            model-0000i-of-0000n.safetensors shards of at most 5 GB and model.safetensors.index.json, the layout
            transformers' save_pretrained writes; random values (std 0.02, norm gains 1) in bfloat16. No tokenizer:
            every workload takes token ids.
2. resid    in bfloat16: load (memory-mapped), a --tokens-token forward with the default capture, the decomposition
            of each pair's prediction by head (attribution.direct, --pairs prompts), a zero-ablation sweep of every
            layer's attention and MLP on one prompt, exact patching of --heads heads spread over the layers and AtP
            over every head for --pairs (clean, corrupt) pairs, and a graph of a --graph-tokens prompt through
            random JumpReLU transcoders (one per layer, --width features, about 0.6% active) visiting at most
            --max-feature-nodes features
3. peer     transformers' AutoModelForCausalLM on the same folder, bfloat16, SDPA attention, no KV cache
            (`use_cache=False`: resid keeps none either): load and the same forward, in a fresh process of its own
            started after resid's has dropped its model (so neither runs on the other's freed memory); their
            logits agree. Both report load + first forward, the time to a first answer from a cold start.

Peak RSS is the largest resident set of this process during the workload (benchmarks/rss.py's 5 ms sampler), the
weight files' pages included; each load starts cold (the files' pages are dropped from the page cache first). What
does not fit is refused before it starts: the writer and both loads check the available memory; resid's sweeps
choose their batch from it.

`--shape 1b` (Llama-3.2-1B's shape) runs the same code as a slow test (tests/load/test_scale.py).
"""

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rss import PeakRSS, rss

import resid
from resid.batching import host_available_bytes
from resid.dictionaries import ActivationFunction, Binding, Dictionary, Weights, check

ROOT = Path(__file__).resolve().parents[1]
SHARD_BYTES = 5 * 10**9

# Llama 3.1 8B and Llama 3.2 1B as their config.json files give them (rope: llama3 scaling)
SHAPES = {
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
               intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
               rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}),
}


def config_json(shape: str) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
            "torch_dtype": "bfloat16", **SHAPES[shape]}


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, in the order transformers writes them."""
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d_head = config.get("head_dim", d // config["num_attention_heads"])
    q, kv = config["num_attention_heads"] * d_head, config["num_key_value_heads"] * d_head
    shapes = {"model.embed_tokens.weight": (v, d)}
    for layer in range(config["num_hidden_layers"]):
        at = f"model.layers.{layer}"
        shapes |= {f"{at}.self_attn.q_proj.weight": (q, d), f"{at}.self_attn.k_proj.weight": (kv, d),
                   f"{at}.self_attn.v_proj.weight": (kv, d), f"{at}.self_attn.o_proj.weight": (d, q),
                   f"{at}.mlp.gate_proj.weight": (f, d), f"{at}.mlp.up_proj.weight": (f, d),
                   f"{at}.mlp.down_proj.weight": (d, f), f"{at}.input_layernorm.weight": (d,),
                   f"{at}.post_attention_layernorm.weight": (d,)}
    shapes["model.norm.weight"] = (d,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    return shapes


def write_model(folder: Path, shape: str) -> None:
    """The random checkpoint, sharded as transformers shards it; written once (index last, so a folder with an
    index is complete)."""
    from safetensors.torch import save_file

    index_path = folder / "model.safetensors.index.json"
    if index_path.exists():
        return
    config = config_json(shape)
    shapes = tensor_shapes(config)
    total = sum(2 * math.prod(s) for s in shapes.values())
    largest = max(2 * math.prod(s) for s in shapes.values())
    free = host_available_bytes()
    if free is not None and free < 3 * largest + SHARD_BYTES:  # a shard in bf16 plus one tensor's float32 draw
        sys.exit(f"Writing the {shape} checkpoint needs about {(3 * largest + SHARD_BYTES) / 2**30:.1f} GiB of "
                 f"memory; {free / 2**30:.1f} GiB is available. Free memory first.")
    folder.mkdir(parents=True, exist_ok=True)
    shards: list[list[str]] = [[]]
    size = 0
    for name, s in shapes.items():
        if shards[-1] and size + 2 * math.prod(s) > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += 2 * math.prod(s)
    generator = torch.Generator().manual_seed(0)
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shapes[name], dtype=torch.bfloat16)
            else:
                tensors[name] = (0.02 * torch.randn(shapes[name], generator=generator)).to(torch.bfloat16)
            weight_map[name] = file
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
        print(f"  wrote {file} ({len(names)} tensors)", flush=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    index_path.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def drop_cached(folder: Path) -> None:
    """Drop the weight files' pages from the page cache, so that a load reads them from disk (a cold start)."""
    for path in folder.glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, float, float, str]] = []

    def measure(self, library: str, workload: str, fn, note=lambda result: "", repeats: int = 1):
        """fn's median time over `repeats` calls and the peak RSS while they ran."""
        gc.collect()
        times = []
        with PeakRSS() as peak:
            for _ in range(repeats):
                start = time.perf_counter()
                result = fn()
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        self.rows.append((library, workload, seconds, peak.start / 2**30, peak.peak / 2**30, note(result)))
        print(f"  {library:<12} {workload:<48} {seconds:8.1f} s  RSS {peak.start / 2**30:6.2f} -> peak "
              f"{peak.peak / 2**30:6.2f} GiB  {note(result)}", flush=True)
        return result

    def combined(self, library: str, workload: str, parts: list[str]) -> None:
        """A row adding up earlier rows of `library` (their times; the largest of their RSS figures)."""
        rows = [row for row in self.rows if row[0] == library and row[1] in parts]
        assert len(rows) == len(parts), (library, parts)
        self.rows.append((library, workload, sum(r[2] for r in rows), rows[0][3], max(r[4] for r in rows), ""))
        print(f"  {library:<12} {workload:<48} {self.rows[-1][2]:8.1f} s", flush=True)

    def markdown(self) -> str:
        lines = ["| library | workload | seconds | RSS before (GiB) | peak RSS (GiB) | |", "|---|---|---|---|---|---|"]
        lines += [f"| {lib} | {work} | {s:.1f} | {before:.2f} | {peak:.2f} | {note} |"
                  for lib, work, s, before, peak, note in self.rows]
        return "\n".join(lines)


def transcoders(model: resid.Transformer, width: int) -> list[Dictionary]:
    """Random JumpReLU transcoders, one per layer: the encoder reads the standardized MLP input with unit-norm
    columns, so a pre-activation is about N(0, 1) and a threshold of 2.5 keeps about 0.6% of the features."""
    d = model.config.d_model
    out = []
    for layer in range(model.config.n_layers):
        g = torch.Generator().manual_seed(layer)
        w_enc = torch.randn(d, width, generator=g)
        weights = Weights(w_enc / w_enc.norm(dim=0), 0.02 * torch.randn(width, d, generator=g), torch.zeros(d),
                          torch.zeros(width))
        binding = Binding(f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out")
        out.append(check(Dictionary(weights, ActivationFunction("jumprelu", torch.full((width,), 2.5)),
                                    binding=binding, name=f"random{layer}"), model))
    return out


def spread_heads(config, n: int) -> list[resid.Site]:
    """`n` heads spread evenly over the layers and the heads."""
    total = config.n_layers * config.n_heads
    picked = sorted({round(i * total / n) for i in range(n)})
    return [resid.Site(i // config.n_heads, "attn", head=i % config.n_heads) for i in picked]


def run_resid(folder: Path, args, table: Table, ids: torch.Tensor, corrupt: torch.Tensor) -> torch.Tensor:
    from resid.analyses import Execution, ablation, attribution, graphs, patching

    quiet = Execution(progress=False)
    drop_cached(folder)
    model = table.measure("resid", "load (bf16, memory-mapped)",
                          lambda: resid.load(folder, dtype="bfloat16"),
                          note=lambda m: f"RSS after: {rss() / 2**30:.2f} GiB")
    config = model.config
    with torch.no_grad():
        logits = table.measure("resid", f"forward, {args.tokens} tokens (first: pages in)",
                               lambda: model.run(ids[:1]).logits[0].float())
        table.measure("resid", f"forward, {args.tokens} tokens (median of 3)", lambda: model.run(ids[:1]).logits,
                      repeats=3)
    table.combined("resid", f"load + first forward, {args.tokens} tokens",
                   ["load (bf16, memory-mapped)", f"forward, {args.tokens} tokens (first: pages in)"])
    top = model.run(ids, capture=resid.Capture.none(), logits_at="last").logits[:, 0].float().topk(2).indices
    targets, baselines = top[:, 0].tolist(), top[:, 1].tolist()
    heads = spread_heads(config, args.heads)
    workloads = {
        "decomposition": (f"decomposition by head, {args.pairs} prompts",
                          lambda: attribution.direct(model, ids, targets, baselines, level="head"),
                          lambda df: f"{len(df):,} rows"),
        "ablation": (f"ablation sweep, {2 * config.n_layers} sublayers, 1 prompt",
                     lambda: ablation.sweep(model, ids[:1], targets[:1], baselines[:1], sites="sublayer",
                                            method="zero", execution=quiet),
                     lambda df: f"{len(df)} rows"),
        "patching": (f"exact patching, {len(heads)} heads x {args.pairs} pairs",
                     lambda: patching.activation(model, ids, corrupt, targets, baselines, sites=heads,
                                                 execution=quiet),
                     lambda df: f"{len(df):,} rows"),
        "atp": (f"AtP, every head ({config.n_layers * config.n_heads}) x {args.pairs} pairs",
                lambda: patching.atp(model, ids, corrupt, targets, baselines, sites="head", execution=quiet),
                lambda df: f"{len(df):,} rows"),
        "graph": (f"graph, {args.graph_tokens} tokens, {args.width}-feature transcoders",
                  lambda: graphs.attribute(model, ids[0, :args.graph_tokens], transcoders(model, args.width),
                                           max_feature_nodes=args.max_feature_nodes),
                  lambda g: (f"{g.metadata['n_active_features']:,} active, {g.n_features} visited, "
                             f"logit error {g.metadata['replacement_logit_error']:.1e}")),
    }
    for name in args.workloads.split(","):
        if name:
            workload, fn, note = workloads[name]
            table.measure("resid", workload, fn, note=note)
    del model
    gc.collect()
    return logits


def run_peer(folder: Path, args, table: Table) -> torch.Tensor | None:
    """transformers' load and forward in a fresh Python process (`--peer-process`); its rows join `table`."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        command = [sys.executable, __file__, "--peer-process", str(out), "--shape", args.shape, "--folder",
                   str(folder), "--tokens", str(args.tokens), "--pairs", str(args.pairs)]
        done = subprocess.run(command, stdout=sys.stdout, stderr=sys.stderr)
        if done.returncode != 0 or not (out / "rows.json").exists():
            print(f"  transformers: its process ended with {done.returncode} before writing its rows")
            return None
        table.rows += [tuple(row) for row in json.loads((out / "rows.json").read_text())]
        if not (out / "logits.safetensors").exists():
            return None
        from safetensors.torch import load_file

        return load_file(out / "logits.safetensors")["logits"]


def peer_process(folder: Path, args, out: Path) -> None:
    """The peer's side: load transformers' model cold, time its forward, write the rows and the logits to `out`."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    table = Table()
    ids = token_ids(args)[0]
    need, free = sum(p.stat().st_size for p in folder.glob("*.safetensors")), host_available_bytes()
    if free is not None and need > free:
        print(f"  transformers: not loaded, its bf16 weights need {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB "
              "is available")
        (out / "rows.json").write_text("[]")
        return
    drop_cached(folder)
    hf = table.measure("transformers", "load (bf16)",
                       lambda: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                                                    attn_implementation="sdpa").eval(),
                       note=lambda m: f"RSS after: {rss() / 2**30:.2f} GiB")
    with torch.no_grad():
        logits = table.measure("transformers", f"forward, {args.tokens} tokens (first: pages in)",
                               lambda: hf(ids[:1], use_cache=False).logits[0].float())
        table.measure("transformers", f"forward, {args.tokens} tokens (median of 3)",
                      lambda: hf(ids[:1], use_cache=False).logits, repeats=3)
    table.combined("transformers", f"load + first forward, {args.tokens} tokens",
                   ["load (bf16)", f"forward, {args.tokens} tokens (first: pages in)"])
    save_file({"logits": logits.contiguous()}, str(out / "logits.safetensors"))
    (out / "rows.json").write_text(json.dumps(table.rows))


def token_ids(args) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts (random token ids, the same in both processes) and their corrupted copies."""
    vocab = config_json(args.shape)["vocab_size"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (args.pairs, args.tokens), generator=g)
    corrupt = ids.clone()
    corrupt[:, args.tokens // 2] = torch.randint(0, vocab, (args.pairs,), generator=g)
    return ids, corrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--graph-tokens", type=int, default=32)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--max-feature-nodes", type=int, default=128)
    parser.add_argument("--workloads", default="decomposition,ablation,patching,atp,graph",
                        help="resid's workloads after load and forward (comma-separated; empty: none)")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="also write the table and the logits' agreement as JSON")
    parser.add_argument("--peer-process", type=Path, default=None, help=argparse.SUPPRESS)  # run_peer's child
    args = parser.parse_args(argv)
    folder = args.folder or ROOT / "build" / "scale" / f"llama-{args.shape}"
    if args.peer_process is not None:
        peer_process(folder, args, args.peer_process)
        return 0
    started = time.perf_counter()
    write_model(folder, args.shape)
    print(f"weights: {folder} written in {time.perf_counter() - started:.0f} s (0 if cached)", flush=True)
    ids, corrupt = token_ids(args)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Llama-{args.shape}-shaped, random bf16; "
          f"available memory {host_available_bytes() / 2**30:.1f} GiB", flush=True)
    table = Table()
    ours = run_resid(folder, args, table, ids, corrupt)
    agreement = {}
    theirs = None if args.no_peer else run_peer(folder, args, table)
    if theirs is not None:
        agreement = {"max_logit_difference": (ours - theirs).abs().max().item(), "logit_std": theirs.std().item(),
                     "top1_agreement": (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()}
        print("resid vs transformers logits (bf16): max |difference| {max_logit_difference:.3f} (logit std "
              "{logit_std:.3f}), top-1 agreement {top1_agreement:.3f}".format(**agreement))
    print(table.markdown())
    if args.out is not None:
        rows = [dict(zip(("library", "workload", "seconds", "rss_before_gib", "peak_rss_gib", "note"), row))
                for row in table.rows]
        args.out.write_text(json.dumps({"shape": args.shape, "rows": rows, **agreement}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
