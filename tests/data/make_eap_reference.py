"""Regenerate tests/data/eap-reference/: circuitkit's EAP and EAP-IG edge scores of a tiny random GPT-2 and a tiny
random GQA Llama, the oracle of tests/analyses/test_circuits_reference.py.

    python tests/data/make_eap_reference.py            # build the venv if needed, rewrite the fixtures
    python tests/data/make_eap_reference.py --check    # regenerate elsewhere, compare, write nothing

The script makes its own virtual environment (build/eap-reference-venv: torch==2.13.0 first, so that pip does not
pull a CUDA build, then circuitkit==0.2.0 with the TransformerLens and transformers it pins) and re-runs itself
inside it; resid is never imported, so the reference cannot agree with resid by construction.

What it writes per model (gpt2/, llama_gqa/; no pickles):
    model/                 the random model, written by transformers (save_pretrained), loaded into TransformerLens
                           with TransformerLens's own converter (convert_gpt2_weights / convert_llama_weights)
    reference.safetensors  the pairs' token ids (a BOS first, as circuitkit tokenizes), targets and baselines, and
                           circuitkit's score matrices [n_forward n_backward] of get_scores_eap and get_scores_eap_ig
                           (5 steps), the metric the summed logit difference at the last position (circuitkit divides
                           by the number of pairs: a mean)
    reference.json         the settings and the library versions
and circuitkit's licence (LICENSE.md) beside them. circuitkit's graph: forward index 0 the input, then per layer
the heads and the MLP; backward index per layer q, k, v for every query head (GQA ungrouped: each query head's copy
of its key/value head's input), then the MLP, and the logits last.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "eap-reference"
VENV = ROOT / "build" / "eap-reference-venv"
PINS = ["circuitkit==0.2.0"]
VOCAB, D_MODEL, N_LAYERS, N_HEADS, N_POS = 64, 48, 2, 4, 64
PAIRS = 6  # pairs of 7 tokens (a BOS and 6 words), the corrupt prompt differing at two positions
STEPS = 5
TOLERANCE = 1e-5


def ensure_venv() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reference_venv import build_venv

    return build_venv(VENV, "torch==2.13.0", PINS)


def tokenizer_folder(where: Path) -> str:
    """A word-level tokenizer of the tiny vocabulary: "<bos>" (id 0, also the padding) and "t1".."t63"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, **{f"t{i}": i for i in range(1, VOCAB)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<bos>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", pad_token="<bos>").save_pretrained(where)
    return str(where)


def build(kind: str, out: Path, tokenizer: str):
    """(the transformers model saved in out/model, TransformerLens's model of the same weights)."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights, convert_llama_weights
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0 if kind == "gpt2" else 1)
    common = dict(n_layers=N_LAYERS, d_model=D_MODEL, d_head=D_MODEL // N_HEADS, n_heads=N_HEADS, d_vocab=VOCAB,
                  n_ctx=N_POS, tokenizer_name=tokenizer, default_prepend_bos=True, dtype=torch.float32, device="cpu",
                  model_name=f"tiny-{kind}")
    if kind == "gpt2":
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=N_POS, n_embd=D_MODEL, n_layer=N_LAYERS,
                                        n_head=N_HEADS, activation_function="gelu_new", initializer_range=0.2))
        cfg = HookedTransformerConfig(**common, d_mlp=4 * D_MODEL, act_fn="gelu_new", normalization_type="LN",
                                      positional_embedding_type="standard", original_architecture="GPT2LMHeadModel")
        convert = convert_gpt2_weights
    else:
        hf = LlamaForCausalLM(LlamaConfig(
            vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=96, num_hidden_layers=N_LAYERS,
            num_attention_heads=N_HEADS, num_key_value_heads=2, head_dim=D_MODEL // N_HEADS,
            max_position_embeddings=N_POS, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
            initializer_range=0.2))
        cfg = HookedTransformerConfig(**common, n_key_value_heads=2, d_mlp=96, act_fn="silu",
                                      normalization_type="RMS", final_rms=True, eps=1e-5,
                                      positional_embedding_type="rotary", rotary_dim=D_MODEL // N_HEADS,
                                      rotary_base=10000.0, rotary_adjacent_pairs=False, gated_mlp=True,
                                      original_architecture="LlamaForCausalLM")
        convert = convert_llama_weights
    hf = hf.float().eval()
    with torch.no_grad():  # gains around 1 and biases around 0 with a spread, so that a mis-mapped one shows
        for name, p in hf.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "norm.weight", "layernorm.weight")):
                p.copy_(1 + 0.2 * torch.randn(p.shape))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape))
    hf.save_pretrained(out / "model", safe_serialization=True)
    (out / "model" / "generation_config.json").unlink(missing_ok=True)
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(convert(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False,
                                      refactor_factored_attn_matrices=False)
    model.set_use_attn_result(True)
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    if kind != "gpt2":
        model.set_ungroup_grouped_query_attention(True)
    return model.eval()


def pairs():
    """(clean texts, corrupt texts, [target, baseline] per pair)."""
    import torch

    g = torch.Generator().manual_seed(7)
    clean = torch.randint(1, VOCAB, (PAIRS, 6), generator=g)
    corrupt = clean.clone()
    corrupt[:, 1] = torch.randint(1, VOCAB, (PAIRS,), generator=g)
    corrupt[:, 4] = torch.randint(1, VOCAB, (PAIRS,), generator=g)
    labels = torch.randint(1, VOCAB, (PAIRS, 2), generator=g)
    text = lambda ids: [" ".join(f"t{int(i)}" for i in row) for row in ids]  # noqa: E731
    return text(clean), text(corrupt), labels


def metric(logits, clean_logits, input_lengths, labels):
    """The logit difference (target - baseline) at each prompt's last token, summed over the batch."""
    import torch

    rows = torch.arange(logits.shape[0])
    last = logits[rows, input_lengths - 1]
    return (last[rows, labels[:, 0]] - last[rows, labels[:, 1]]).sum()


def generate(out: Path) -> None:
    import importlib.metadata as md

    from circuitkit.backends.eap.attribute import get_scores_eap, get_scores_eap_ig
    from circuitkit.backends.eap.eap_utils import collate_EAP
    from circuitkit.backends.eap.graph import Graph
    from safetensors.torch import save_file
    from torch.utils.data import DataLoader

    out.mkdir(parents=True, exist_ok=True)
    clean, corrupt, labels = pairs()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = tokenizer_folder(Path(tmp) / "tokenizer")
        for kind in ("gpt2", "llama_gqa"):
            folder = out / kind
            model = build(kind, folder, tokenizer)
            data = list(zip(clean, corrupt, labels.tolist()))
            loader = DataLoader(data, batch_size=4, collate_fn=collate_EAP)
            tensors = {"clean": model.to_tokens(clean), "corrupt": model.to_tokens(corrupt), "labels": labels}
            graph = Graph.from_model(model)
            tensors["eap"] = get_scores_eap(model, graph, loader, metric, quiet=True).detach().clone()
            graph = Graph.from_model(model)
            tensors["eap_ig"] = get_scores_eap_ig(model, graph, loader, metric, steps=STEPS,
                                                  quiet=True).detach().clone()
            tensors["tl_logits"] = model(tensors["clean"])[:, -1].detach().clone()
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "reference.safetensors"))
    versions = {p: md.version(p) for p in ("circuitkit", "transformer-lens", "transformers", "torch")}
    (out / "reference.json").write_text(json.dumps({"pairs": PAIRS, "steps": STEPS, "batch_size": 4,
                                                    "metric": "sum of logit(target) - logit(baseline), last token",
                                                    "versions": versions}, indent=1) + "\n")
    licence = [f for f in md.distribution("circuitkit").files if f.name.startswith("LICENSE")]
    if licence:
        (out / licence[0].name).write_bytes(Path(licence[0].locate()).read_bytes())


def compare(regenerated: Path) -> None:
    from safetensors.torch import load_file

    worst = 0.0
    for kind in ("gpt2", "llama_gqa"):
        new = load_file(str(regenerated / kind / "reference.safetensors"))
        old = load_file(str(DATA / kind / "reference.safetensors"))
        worst = max(worst, *(float((new[k].float() - old[k].float()).abs().max()) for k in old))
    print(f"largest difference from the committed reference: {worst:.2e} (tolerance {TOLERANCE:.0e})")
    sys.exit(0 if worst <= TOLERANCE else 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compare", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside is not None:
        generate(Path(args.inside))
        return
    if args.compare is not None:
        compare(Path(args.compare))
        return
    python = ensure_venv()
    target = Path(tempfile.mkdtemp()) if args.check else DATA
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([str(python), __file__, "--inside", str(target)], check=True, env=env)
    if args.check:
        subprocess.run([str(python), __file__, "--compare", str(target)], check=True, env=env)
    else:
        print("wrote", DATA)


if __name__ == "__main__":
    main()
