"""Regenerate transformerlens-hooks/, the oracle of tests/core/test_transformerlens_reference.py: TransformerLens's
own hook names and activations on two tiny random models that both TransformerLens and resid load.

    python tests/data/make_transformerlens_hooks_reference.py            # build the venv if needed, rewrite
    python tests/data/make_transformerlens_hooks_reference.py --check    # regenerate elsewhere, compare

The script makes its own virtual environment (build/transformerlens-venv: torch==2.13.0 first, so that pip does not
pull a CUDA build, then TransformerLens with the transformers it resolves) and re-runs itself inside it; resid is
never imported, so TransformerLens's names and values cannot agree with resid's by construction.

For each family (gpt2: LayerNorm, learned positions, a plain GELU MLP, biases; llama: RMSNorm, rotary, a gated SiLU
MLP, grouped-query attention) it writes
    <family>/model/           a random transformers model (save_pretrained; norm gains 1 + N(0, 0.2))
    <family>.safetensors      TransformerLens's run_with_cache of IDS on HookedTransformer(cfg) with the weights
                              converted by TransformerLens's own converter (convert_gpt2_weights / convert_llama_
                              weights), no weight processing: every cached activation by its hook name, float32
    <family>.json             every hook point of the model (hook_dict) and the names that fired, in order
TransformerLens's LICENSE (MIT) is copied beside them.
"""

import argparse
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "transformerlens-hooks"
VENV = HERE.parents[1] / "build" / "transformerlens-venv"
PINS = ["transformer-lens==3.9.0", "transformers==5.24.0"]
IDS = [[3, 17, 42, 8, 25, 60, 11]]
VOCAB = 64
TOLERANCE = 1e-5  # --check: largest |difference| of any activation


def _randomize(hf) -> None:
    import torch

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # gains and biases away from 1 and 0, so that a skipped gain or bias shows
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.2 * noise if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "norm.weight"))
                    else 0.2 * noise)


def _models():
    import torch
    import transformers
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights, convert_llama_weights

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, n_inner=64, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, tie_word_embeddings=False))
    gpt2_cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, d_head=8, n_heads=4, d_mlp=64, d_vocab=VOCAB, n_ctx=32, act_fn="gelu_new",
        normalization_type="LN", eps=1e-5, positional_embedding_type="standard",
        original_architecture="GPT2LMHeadModel", default_prepend_bos=False, dtype=torch.float32, device="cpu")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False))
    llama_cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, d_head=8, n_heads=4, n_key_value_heads=2, d_mlp=64, d_vocab=VOCAB, n_ctx=32,
        act_fn="silu", normalization_type="RMS", final_rms=True, eps=1e-5, positional_embedding_type="rotary",
        rotary_dim=8, rotary_base=10000.0, rotary_adjacent_pairs=False, gated_mlp=True,
        original_architecture="LlamaForCausalLM", default_prepend_bos=False, dtype=torch.float32, device="cpu")
    return {"gpt2": (gpt2, gpt2_cfg, convert_gpt2_weights), "llama": (llama, llama_cfg, convert_llama_weights)}


def generate(out: Path) -> None:
    import importlib.metadata as md

    import torch
    from safetensors.torch import save_file
    from transformer_lens import HookedTransformer

    for family, (hf, cfg, convert) in _models().items():
        hf = hf.float().eval()
        _randomize(hf)
        hf.save_pretrained(out / family / "model", safe_serialization=True)
        model = HookedTransformer(cfg)
        missing, unexpected = model.load_state_dict(convert(hf, cfg), strict=False)
        if unexpected or [k for k in missing if not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos", "b_U"))]:
            raise SystemExit(f"{family}: TransformerLens weights missing {missing}, unexpected {unexpected}")
        model.eval()
        with torch.no_grad():
            logits, cache = model.run_with_cache(torch.tensor(IDS))
            hf_logits = hf(torch.tensor(IDS)).logits
        if not torch.allclose(logits, hf_logits, atol=1e-4):  # TransformerLens's model is the saved one
            raise SystemExit(f"{family}: TransformerLens's logits differ from transformers' by "
                             f"{(logits - hf_logits).abs().max().item():.3g}")
        tensors = {name: value.float().contiguous().clone() for name, value in cache.items()}  # aliases stored apart
        save_file({**tensors, "input_ids": torch.tensor(IDS), "logits": logits.float().clone()},
                  str(out / f"{family}.safetensors"),
                  metadata={"source": f"transformer-lens {md.version('transformer-lens')}, transformers "
                                      f"{md.version('transformers')}, torch {md.version('torch')}"})
        (out / f"{family}.json").write_text(json.dumps(
            {"hook_points": list(model.hook_dict), "cached": list(cache.keys())}, indent=1) + "\n")
    licence = next(Path(md.distribution("transformer-lens").locate_file("")).glob(
        "transformer_lens-*.dist-info/licenses/LICENSE"), None) or next(Path(md.distribution(
            "transformer-lens").locate_file("")).glob("transformer_lens-*.dist-info/LICENSE"))
    shutil.copy(licence, out / "LICENSE")


def compare(new: Path, old: Path) -> bool:
    from reference_venv import same_tensors

    ok = True
    for family in ("gpt2", "llama"):
        # attention scores hold -inf where masked: same_tensors counts equal infinities as equal
        ok = ok and same_tensors(new / f"{family}.safetensors", old / f"{family}.safetensors", TOLERANCE)
        ok = ok and (new / f"{family}.json").read_text() == (old / f"{family}.json").read_text()
    print("agrees with" if ok else "DISAGREES with", old)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    parser.add_argument("--inside", type=Path, default=None, help=argparse.SUPPRESS)  # in TransformerLens's venv
    args = parser.parse_args()
    if args.inside is not None:
        generate(args.inside)
        return
    from reference_venv import build_venv, write_or_check  # beside this script (sys.path[0] when it runs)

    python = build_venv(VENV, "torch==2.13.0", PINS)
    if not args.check:
        shutil.rmtree(OUT, ignore_errors=True)
    write_or_check(python, __file__, OUT, args.check, compare)


if __name__ == "__main__":
    main()
