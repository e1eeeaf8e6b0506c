"""Regenerate tests/data/graphs/clt/ and clt-reference.safetensors: a cross-layer transcoder that resid writes in
circuit-tracer's format (resid.dictionaries.formats.circuit_tracer.write) for the tiny Llama of tests/data/graphs,
and the attribution graph circuit-tracer 0.5.0 builds through it after loading the files with its own load_clt:
the oracle of tests/graphs/test_clt_in_circuit_tracer.py.

    .venv/bin/python tests/data/make_clt_reference.py            # rewrite the committed files
    .venv/bin/python tests/data/make_clt_reference.py --check    # regenerate elsewhere and compare, write nothing

Run it with resid's Python: resid trains the CLT (`clt(model)`: train_crosslayer on the tiny Llama, given a word-level
tokenizer, reading each layer's ln2.hook_normalized and writing hook_mlp_out) and writes it, then the script re-runs
itself (--inside) in circuit-tracer's environment,
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
sys.path.insert(0, str(HERE))  # make_graph_reference and reference_venv, beside this file
DATA = HERE / "graphs"
N_FEATURES = 24
TOLERANCE = 1e-5  # --check: largest |difference| of the regenerated graph from the committed one


def model_with_tokenizer(where: Path):
    """The tiny Llama of tests/data/graphs with make_graph_reference's word-level tokenizer beside it (resid reads a
    folder's tokenizer.json), so that resid can train on text."""
    from make_graph_reference import tokenizer_folder

    import resid

    shutil.copytree(DATA / "model", where / "model")
    tokenizer_folder(where / "tokenizer")
    shutil.copy(where / "tokenizer" / "tokenizer.json", where / "model" / "tokenizer.json")
    return resid.load(where / "model")


def clt(model):
    """The CLT the fixture holds, trained by resid (train_crosslayer: JumpReLU, 24 features per layer, 20 steps of
    128 tokens of seeded random text, one thread so that its sums round alike), named for the fixture's model."""
    import torch

    from resid.analyses import Execution
    from resid.analyses.training import train_crosslayer
    from resid.analyses.training.recipe import Recipe

    g = torch.Generator().manual_seed(0)
    texts = [" ".join(f"t{int(i)}" for i in torch.randint(1, 64, (40,), generator=g)) for _ in range(200)]
    recipe = Recipe(activation="jumprelu", d_sae=N_FEATURES, steps=20, batch_size=128, lr=3e-2, warmup_steps=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trained = train_crosslayer(model, texts, recipe, Execution(progress=False), window=32, buffer_tokens=1280)
    finally:
        torch.set_num_threads(threads)
    trained.model_name = "tiny-llama"
    return trained


def write_clt(out: Path) -> None:
    """resid's side: the trained CLT's files in circuit-tracer's layout."""
    from resid.dictionaries.formats import circuit_tracer

    with tempfile.TemporaryDirectory() as scratch:
        circuit_tracer.write(clt(model_with_tokenizer(Path(scratch))), out / "clt")


def graph(out: Path) -> None:
    """circuit-tracer's side (in its venv): load the CLT, build the graph, write it."""
    import make_graph_reference as tiny
    import torch
    import yaml
    from circuit_tracer import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    from safetensors.torch import save_file
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(DATA / "model").float().eval()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = HookedTransformerConfig(
            n_layers=tiny.N_LAYERS, d_model=tiny.D_MODEL, d_head=12, n_heads=4, n_key_value_heads=2, d_mlp=96,
            d_vocab=tiny.VOCAB, n_ctx=64, act_fn="silu", normalization_type="RMS", final_rms=True, eps=1e-5,
            positional_embedding_type="rotary", rotary_dim=12, rotary_base=10000.0, rotary_adjacent_pairs=False,
            gated_mlp=True, original_architecture="LlamaForCausalLM",
            tokenizer_name=tiny.tokenizer_folder(Path(tmp) / "tokenizer"), model_name="tiny-llama",
            default_prepend_bos=False, dtype=torch.float32, device="cpu")
        config = yaml.safe_load((out / "clt" / "config.yaml").read_text())  # the hooks resid wrote
        transcoder = load_clt(str(out / "clt"), feature_input_hook=config["feature_input_hook"],
                              feature_output_hook=config["feature_output_hook"], scan=config["scan"],
                              device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False)
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
            same &= all(same_tensors(target / "clt" / f.name, f, TOLERANCE)
                        for f in (DATA / "clt").glob("*.safetensors"))
            print("agrees with" if same else "differs from", DATA)
            sys.exit(0 if same else 1)
    shutil.copy(DATA / "circuit-tracer.LICENSE", DATA / "clt" / "circuit-tracer.LICENSE")
    print(f"wrote {DATA / 'clt'} and {DATA / 'clt-reference.safetensors'}")


if __name__ == "__main__":
    main()
