"""Regenerate tests/data/graphs/clt/ and clt-reference.safetensors: a cross-layer transcoder that resid writes in
circuit-tracer's format (resid.dictionaries.formats.circuit_tracer.write) for the tiny Llama of tests/data/graphs,
and the attribution graph circuit-tracer 0.5.0 builds through it after loading the files with its own load_clt:
the oracle of tests/graphs/test_clt_in_circuit_tracer.py.

    .venv/bin/python tests/data/make_clt_reference.py            # rewrite the committed files
    .venv/bin/python tests/data/make_clt_reference.py --check    # regenerate elsewhere and compare, write nothing

Run it with resid's Python: resid writes the CLT (seeded random weights, `clt(model)`: what is checked is the format
and the graph, not a training), then the script re-runs itself (--inside) in circuit-tracer's environment,
build/graph-reference-venv (tests/data/make_graph_reference.py makes it), which never imports resid. There
circuit-tracer's load_clt reads the files, TransformerLens builds the model of tests/data/graphs/model as
make_graph_reference.py does, and circuit-tracer's attribute() gives the graph of its prompt. Written beside the
CLT files: clt-reference.safetensors, circuit-tracer's adjacency matrix, its selected active features, logit tokens
and logit probabilities (float32 and int64, safetensors).
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "graphs"
N_FEATURES = 24
TOLERANCE = 1e-5  # --check: largest |difference| of the regenerated graph from the committed one


def clt(model):
    """The CLT the fixture holds: seeded, JumpReLU, reading mlp.hook_in and writing mlp.hook_out of every layer."""
    import torch

    from resid.dictionaries import CrossLayerTranscoder, check

    n, d, f = model.config.n_layers, model.config.d_model, N_FEATURES
    g = torch.Generator().manual_seed(3)
    return check(CrossLayerTranscoder(
        W_enc=torch.randn(n, d, f, generator=g) / d**0.5, b_enc=-0.3 - 0.3 * torch.rand(n, f, generator=g),
        W_dec=[torch.randn(f, n - layer, d, generator=g) / f**0.5 for layer in range(n)],
        b_dec=0.1 * torch.randn(n, d, generator=g), activation="jumprelu",
        threshold=0.05 * torch.rand(n, f, generator=g), hook_in="mlp.hook_in", hook_out="mlp.hook_out", name="clt",
    ), model)


def write_clt(out: Path) -> None:
    """resid's side: the CLT's files in circuit-tracer's layout."""
    import resid
    from resid.dictionaries.formats import circuit_tracer

    circuit_tracer.write(clt(resid.load(DATA / "model")), out / "clt")


def graph(out: Path) -> None:
    """circuit-tracer's side (in its venv): load the CLT, build the graph, write it."""
    import torch
    from circuit_tracer import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    from safetensors.torch import save_file
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(HERE))
    import make_graph_reference as tiny

    hf = LlamaForCausalLM.from_pretrained(DATA / "model").float().eval()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = HookedTransformerConfig(
            n_layers=tiny.N_LAYERS, d_model=tiny.D_MODEL, d_head=12, n_heads=4, n_key_value_heads=2, d_mlp=96,
            d_vocab=tiny.VOCAB, n_ctx=64, act_fn="silu", normalization_type="RMS", final_rms=True, eps=1e-5,
            positional_embedding_type="rotary", rotary_dim=12, rotary_base=10000.0, rotary_adjacent_pairs=False,
            gated_mlp=True, original_architecture="LlamaForCausalLM",
            tokenizer_name=tiny.tokenizer_folder(Path(tmp) / "tokenizer"), model_name="tiny-llama",
            default_prepend_bos=False, dtype=torch.float32, device="cpu")
        transcoder = load_clt(str(out / "clt"), feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out",
                              scan="clt", device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False)
        model = TransformerLensReplacementModel.from_config(cfg, transcoder)
        state = {re.sub(r"^(blocks\.\d+\.mlp|unembed)\.", lambda m: f"{m[1]}.old_{m[1].split('.')[-1]}.", k): v
                 for k, v in convert_llama_weights(hf, cfg).items()}
        model.load_state_dict(state, strict=False)
        found = attribute(torch.tensor(tiny.PROMPT), model)
    save_file({"adjacency": found.adjacency_matrix.float().contiguous(),
               "features": found.active_features[found.selected_features].long().contiguous(),
               "logit_tokens": torch.tensor([t.vocab_idx for t in found.logit_targets]),
               "logit_probabilities": found.logit_probabilities.float().contiguous()},
              str(out / "clt-reference.safetensors"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside is not None:
        graph(Path(args.inside))
        return
    sys.path.insert(0, str(HERE))
    from make_graph_reference import ensure_venv
    from reference_venv import same_tensors

    python = ensure_venv()
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) if args.check else DATA
        write_clt(target)
        subprocess.run([str(python), __file__, "--inside", str(target)], check=True,
                       env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
        if args.check:
            same = same_tensors(target / "clt-reference.safetensors", DATA / "clt-reference.safetensors", TOLERANCE)
            same &= all(same_tensors(target / "clt" / f.name, f, 0.0) for f in (DATA / "clt").glob("*.safetensors"))
            print("agrees with" if same else "differs from", DATA)
            sys.exit(0 if same else 1)
    shutil.copy(DATA / "circuit-tracer.LICENSE", DATA / "clt" / "circuit-tracer.LICENSE")
    print(f"wrote {DATA / 'clt'} and {DATA / 'clt-reference.safetensors'}")


if __name__ == "__main__":
    main()
