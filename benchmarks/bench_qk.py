"""QK attribution on SmolLM2-135M: every head of every layer at the last position of a 64-token prompt, against the
model's forward pass on the same prompt, timed side by side (interleaved rounds, medians).

    python benchmarks/bench_qk.py [--tokens 64] [--transcoders DIR] [--repeats 3]

1. transcoders  DIR: a folder of per-layer transcoders (`resid train-transcoder --layers all --out DIR`); without
                it, 30 random ReLU transcoders (2,304 features, biases set so that about 16 fire per position and
                layer, as trained BatchTopK k=16 ones do): this measures speed, not meaning
2. forward      model.run on the prompt (no capture beyond the default)
3. build        graphs.QK(model, prompt, transcoders): the spliced run recording patterns, scores, heads' z and
                q/k projections (the run an attribution graph makes, plus those fields)
4. heads        qk.heads(query=-1): for each of the 270 heads, its score at the key it attends to most split into
                pairs, both marginals and the top pair
5. the bound    the multiply-adds those take, counted from the terms: each term's query (n_q x d_model x d_q, all
                heads at once) and key (n_k x d_model x d_kv per key position used), and the bilinear forms
                (n_q x n_k x d_head per head); against the forward's (2 x parameters x tokens, embeddings aside)
6. memory       what the QK object holds after heads: its cached terms and projections (bytes of their tensors;
                the spliced run it keeps is the graph's own, counted apart)

Target (issue 39): within a few forward passes' time on CPU; memory linear in the nodes.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import interleaved  # noqa: E402


def random_transcoders(model, d_sae: int = 2304, seed: int = 0):
    """Per-layer ReLU transcoders reading each MLP's standardized input, b_enc set so ~16 of d_sae fire."""
    from resid.dictionaries import Binding, Dictionary, Weights, check

    g = torch.Generator().manual_seed(seed)
    d = model.config.d_model
    threshold = float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - 16 / d_sae)))
    out = []
    for layer in range(model.config.n_layers):
        W_enc = torch.randn(d, d_sae, generator=g) / d**0.5
        weights = Weights(W_enc, torch.randn(d_sae, d, generator=g) / 8, torch.zeros(d), -threshold * torch.ones(d_sae))
        binding = Binding(f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out")
        out.append(check(Dictionary(weights, binding=binding, name=f"t{layer}"), model))
    return out


def multiply_adds(qk, table) -> dict[str, int]:
    """The multiply-adds of the projections and the bilinear forms behind `table` (qk.heads's rows)."""
    config = qk.model.config
    d, d_q, d_kv, d_head = config.d_model, config.n_heads * config.d_head, config.n_kv_heads * config.d_head, \
        config.d_head
    query = qk.n_pos - 1
    projections = bilinear = 0
    for layer in range(config.n_layers):
        n_q = len(qk.terms(layer, query).sites) + 1
        projections += n_q * d * d_q
        keys = {int(k) for k in table[table["head"].str.startswith(f"layers[{layer}].")]["key"]}
        sizes = {k: len(qk.terms(layer, k).sites) + 1 for k in keys}
        projections += sum(sizes.values()) * d * d_kv
        for key in table[table["head"].str.startswith(f"layers[{layer}].")]["key"]:
            bilinear += n_q * sizes[int(key)] * d_head
    return {"projections": projections, "bilinear": bilinear}


def held_bytes(qk) -> int:
    """Bytes of the tensors the QK object caches (terms by layer and position, projections, head writes)."""
    seen: dict[int, int] = {}

    def add(value) -> None:
        if isinstance(value, torch.Tensor):
            seen[value.data_ptr()] = value.untyped_storage().nbytes()
        elif isinstance(value, (tuple, list)):
            for item in value:
                add(item)
        elif hasattr(value, "vectors"):
            add(value.vectors)

    for cache in (qk._blocks, qk._projected, qk._heads):
        for value in cache.values():
            add(value)
    return sum(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--transcoders", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import resid
    import resid.dictionaries
    from resid.analyses import corpus
    from resid.analyses.graphs.qk import QK

    model = resid.load("smollm2-135m")
    if args.transcoders is not None:
        found = resid.dictionaries.load(args.transcoders, model)
        transcoders, kind = (found if isinstance(found, list) else [found]), f"from {args.transcoders}"
    else:
        transcoders, kind = random_transcoders(model), "random, ~16 firing per position and layer"
    text = " ".join(corpus.demo(max_documents=50))
    ids = torch.tensor([[model.tokenizer.bos_token_id, *model.tokenizer.encode(text)][:args.tokens]])
    print(f"SmolLM2-135M, {args.tokens} tokens, {len(transcoders)} transcoders ({kind}), "
          f"{torch.get_num_threads()} threads")

    times = interleaved({"forward": lambda: model.run(ids), "build": lambda: QK(model, ids, transcoders),
                         "build+heads": lambda: QK(model, ids, transcoders).heads(query=-1)}, args.repeats)
    qk = QK(model, ids, transcoders)
    table = qk.heads(query=-1)
    forward = times["forward"]
    alone = times["build+heads"] - times["build"]
    print(f"forward pass          {forward * 1e3:8.1f} ms")
    print(f"QK build (one run)    {times['build'] * 1e3:8.1f} ms   {times['build'] / forward:5.1f} forwards")
    print(f"heads(query=-1)       {alone * 1e3:8.1f} ms   {alone / forward:5.1f} forwards   (270 heads)")
    both = times["build+heads"]
    print(f"build + heads         {both * 1e3:8.1f} ms   {both / forward:5.1f} forwards")
    n_features = len(qk.rep.features)
    counted = multiply_adds(qk, table)
    config = model.config  # the forward: every weight but the embeddings once per token, plus the logits
    params = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name) + \
        config.d_vocab * config.d_model
    held = held_bytes(qk)
    print(f"active features {n_features:,}; the QK object's caches hold {held / 2**20:.0f} MiB "
          f"({held / max(n_features, 1) / 1024:.1f} KiB per active feature)")
    print(f"multiply-adds: projections {counted['projections'] / 1e9:.2f} G, bilinear forms "
          f"{counted['bilinear'] / 1e9:.3f} G; the forward {params * args.tokens / 1e9:.2f} G")
    strongest = table.reindex(table["pair_value"].abs().sort_values(ascending=False).index).head(5)
    print(strongest[["head", "key", "pattern", "pair_query", "pair_key", "pair_value"]].to_string(index=False))


if __name__ == "__main__":
    main()
