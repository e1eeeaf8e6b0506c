"""Regenerate tests/data/graphs/: circuit-tracer's own attribution graphs of a tiny random Llama, the oracle of
tests/graphs/test_circuit_tracer_reference.py.

    python tests/data/make_graph_reference.py            # build the venv if needed, rewrite the fixtures
    python tests/data/make_graph_reference.py --check    # regenerate elsewhere, compare, write nothing

The script makes its own virtual environment (build/graph-reference-venv: torch==2.13.0 first, so that pip does not
pull a CUDA build, then circuit-tracer from PyPI with the TransformerLens and transformers it pins) and re-runs
itself inside it; resid is never imported, so the reference cannot agree with resid by construction.

What it writes (no pickles):
    model/               a random Llama (2 layers, d_model 48, GQA 4/2 heads, 64 tokens), written by transformers
                         (save_pretrained), and turned into TransformerLens's model by TransformerLens's own converter
    transcoders/         one ReLU skip transcoder per layer (mlp.hook_in -> mlp.hook_out), written by circuit-tracer
                         (TranscoderSet.to_safetensors) with the config.yaml of its cached layout
    reference.safetensors  TransformerLens's logits of the prompt; for each graph ("full": every feature; "budget":
                         max_feature_nodes=24, batch_size=8, update_interval=2) circuit-tracer's adjacency matrix,
                         active and selected features, activations, logit tokens and probabilities, and prune_graph's
                         masks and cumulative scores at (0.8, 0.98)
    reference.json       the prompt, the settings, compute_graph_scores per graph, the library versions
    full.json            create_graph_files's JSON of the full graph (the viewer format), as circuit-tracer writes it
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "graphs"
VENV = ROOT / "build" / "graph-reference-venv"
PINS = ["circuit-tracer==0.5.0"]
PROMPT = [0, 5, 17, 33, 2, 48, 11, 60, 23]  # <bos> first: circuit-tracer zeroes position 0
D_MODEL, D_SAE, N_LAYERS, VOCAB = 48, 32, 2, 64
GRAPHS = {"full": {}, "budget": {"max_feature_nodes": 24, "batch_size": 8, "update_interval": 2}}
TOLERANCE = 1e-5  # --check: largest |difference| between a regenerated reference and the committed one


def ensure_venv() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests import this file as a module
    from reference_venv import build_venv

    return build_venv(VENV, "torch==2.13.0", PINS)


def tokenizer_folder(where: Path) -> str:
    """A folder AutoTokenizer reads offline: a word-level tokenizer of the tiny vocabulary, "<bos>" (id 0, special,
    so circuit-tracer prepends nothing to a prompt starting with it) and "t1".."t63"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, **{f"t{i}": i for i in range(1, VOCAB)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<bos>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>").save_pretrained(where)
    return str(where)


def build_model(out: Path, tokenizer: str):
    import torch
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=96, num_hidden_layers=N_LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.2)
    hf = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape))
    hf.save_pretrained(out / "model", safe_serialization=True)
    cfg = HookedTransformerConfig(
        n_layers=N_LAYERS, d_model=D_MODEL, d_head=12, n_heads=4, n_key_value_heads=2, d_mlp=96, d_vocab=VOCAB,
        n_ctx=64, act_fn="silu", normalization_type="RMS", final_rms=True, eps=1e-5,
        positional_embedding_type="rotary", rotary_dim=12, rotary_base=10000.0, rotary_adjacent_pairs=False,
        gated_mlp=True, original_architecture="LlamaForCausalLM", tokenizer_name=tokenizer, model_name="tiny-llama",
        default_prepend_bos=False, dtype=torch.float32, device="cpu")
    state = convert_llama_weights(hf, cfg)
    generator = torch.Generator().manual_seed(1)
    layers = []
    for layer in range(N_LAYERS):
        t = SingleLayerTranscoder(D_MODEL, D_SAE, torch.nn.functional.relu, layer, skip_connection=True,
                                  device=torch.device("cpu"), dtype=torch.float32)
        with torch.no_grad():
            t.W_enc.copy_(torch.randn(t.W_enc.shape, generator=generator) / D_MODEL**0.5)
            t.W_dec.copy_(torch.randn(t.W_dec.shape, generator=generator) / D_SAE**0.5)
            t.b_enc.copy_(-0.5 - 0.3 * torch.rand(D_SAE, generator=generator))
            t.b_dec.copy_(0.1 * torch.randn(D_MODEL, generator=generator))
            t.W_skip.copy_(0.1 * torch.randn(t.W_skip.shape, generator=generator))
        layers.append(t)
    transcoders = TranscoderSet(dict(enumerate(layers)), feature_input_hook="mlp.hook_in",
                                feature_output_hook="mlp.hook_out", scan="tiny-graph")
    transcoders.to_safetensors(str(out / "transcoders"))
    (out / "transcoders" / "config.yaml").write_text(
        "model_kind: transcoder_set\nmodel_name: tiny-llama\nfeature_input_hook: mlp.hook_in\n"
        "feature_output_hook: mlp.hook_out\nscan: tiny-graph\n")
    model = TransformerLensReplacementModel.from_config(cfg, transcoders)
    # the replacement model wraps each MLP and the unembedding (old_mlp, old_unembed); their weights move with them
    state = {re.sub(r"^(blocks\.\d+\.mlp|unembed)\.", lambda m: f"{m[1]}.old_{m[1].split('.')[-1]}.", k): v
             for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if [k for k in missing if "transcoder" not in k and not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos"))]:
        raise SystemExit(f"TransformerLens weights missing: {missing}")
    return model


def generate(out: Path) -> None:
    import importlib.metadata as md

    import torch
    from circuit_tracer import attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.utils.create_graph_files import create_graph_files
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(out, tokenizer_folder(Path(tmp) / "tokenizer"))
        ids = torch.tensor(PROMPT)
        tensors = {"tl_logits": model(ids[None])[0].detach().float().contiguous()}
        scores = {}
        for name, options in GRAPHS.items():
            graph = attribute(ids, model, **options)
            pruned = prune_graph(graph, 0.8, 0.98)
            scores[name] = dict(zip(("replacement", "completeness"), compute_graph_scores(graph), strict=True))
            tensors.update({f"{name}.{key}": value.detach().clone().contiguous() for key, value in {
                "adjacency": graph.adjacency_matrix.float(), "active_features": graph.active_features.long(),
                "activations": graph.activation_values.float(), "selected": graph.selected_features.long(),
                "logit_tokens": torch.tensor([t.vocab_idx for t in graph.logit_targets]),
                "logit_probabilities": graph.logit_probabilities.float(), "input_tokens": graph.input_tokens.long(),
                "node_mask": pruned.node_mask, "edge_mask": pruned.edge_mask,
                "cumulative_scores": pruned.cumulative_scores.float()}.items()})
            if name == "full":
                create_graph_files(graph, "full", str(Path(tmp) / "json"), scan="tiny-graph")
                shutil.copy(Path(tmp) / "json" / "full.json", out / "full.json")
    save_file(tensors, str(out / "reference.safetensors"))
    versions = {p: md.version(p) for p in ("circuit-tracer", "transformer-lens", "transformers", "torch")}
    (out / "reference.json").write_text(json.dumps({"prompt": PROMPT, "graphs": GRAPHS, "scores": scores,
                                                    "versions": versions}, indent=1) + "\n")
    for extra in ("generation_config.json",):
        (out / "model" / extra).unlink(missing_ok=True)


def compare(regenerated: Path) -> None:
    """Exit 0 when every tensor of the regenerated reference is within TOLERANCE of the committed one."""
    from safetensors.torch import load_file

    new, old = load_file(str(regenerated / "reference.safetensors")), load_file(str(DATA / "reference.safetensors"))
    if set(new) != set(old):
        sys.exit(f"the regenerated reference holds other tensors: {sorted(set(new) ^ set(old))}")
    worst = max(float((new[k].float() - old[k].float()).abs().max()) for k in old)
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
    if args.check:  # compared inside the venv: the Python running this script may have no torch
        sys.exit(subprocess.run([str(python), __file__, "--compare", str(target)], env=env).returncode)
    shutil.copy(DATA.parent / "dictionaries" / "LICENSES" / "circuit-tracer.LICENSE", DATA / "circuit-tracer.LICENSE")
    licence = next((VENV / "lib").glob("python*/site-packages/transformer_lens-*.dist-info/licenses/LICENSE"))
    shutil.copy(licence, DATA / "TransformerLens.LICENSE")
    print(f"wrote {DATA}")


if __name__ == "__main__":
    main()
