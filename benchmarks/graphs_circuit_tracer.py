"""circuit-tracer's side of bench_graphs.py, run with the Python of build/graph-reference-venv (circuit-tracer from
PyPI and the TransformerLens it pins; resid is not imported here):

    build/graph-reference-venv/bin/python benchmarks/graphs_circuit_tracer.py build/bench-graphs short|long<N> [BATCH]

Reads what bench_graphs.py wrote in the folder: model/ (a Hugging Face Llama folder), transcoders/ (a circuit-tracer
transcoder set) and settings.json (the prompts' token ids and the settings). The TransformerLens model is built from
its config with the weights converted by TransformerLens's own Llama converter (no Hub access), the transcoders
loaded by circuit-tracer's own loader, and circuit_tracer.attribute runs with the same settings as resid's side.
Writes peer_<case>.safetensors (the feature rows then the logit rows of the adjacency matrix, the feature nodes,
the logit tokens) and prints one JSON line: seconds, peak RSS growth during attribute.
"""

import gc
import json
import re
import sys
import time
from pathlib import Path

import torch
from rss import PeakRSS
from safetensors.torch import load_file, save_file

# circuit-tracer names its logit nodes with the tokenizer: SmolLM2's, committed with the tests
TOKENIZER = str(Path(__file__).resolve().parents[1] / "tests" / "data" / "smollm2-135m")


def model_and_transcoders(work: Path):
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = json.loads((work / "model" / "config.json").read_text())
    hf = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in hf_config.items() if k != "architectures"}))
    hf.load_state_dict(load_file(str(work / "model" / "model.safetensors")), strict=False)
    if hf_config["tie_word_embeddings"]:
        hf.tie_weights()
    d_model, n_heads = hf_config["hidden_size"], hf_config["num_attention_heads"]
    cfg = HookedTransformerConfig(
        n_layers=hf_config["num_hidden_layers"], d_model=d_model, d_head=hf_config["head_dim"], n_heads=n_heads,
        n_key_value_heads=hf_config["num_key_value_heads"], d_mlp=hf_config["intermediate_size"],
        d_vocab=hf_config["vocab_size"], n_ctx=hf_config["max_position_embeddings"], act_fn="silu",
        normalization_type="RMS", final_rms=True, eps=hf_config["rms_norm_eps"], positional_embedding_type="rotary",
        rotary_dim=hf_config["head_dim"], rotary_base=hf_config["rope_theta"], rotary_adjacent_pairs=False,
        gated_mlp=True, original_architecture="LlamaForCausalLM", tokenizer_name=TOKENIZER, model_name="smollm2-135m",
        default_prepend_bos=False, dtype=torch.float32, device="cpu")
    state = convert_llama_weights(hf, cfg)
    del hf
    gc.collect()
    layers = sorted((work / "transcoders").glob("layer_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
    transcoders = load_transcoder_set({l: str(p) for l, p in enumerate(layers)}, scan="bench-graphs",
                                      feature_input_hook="ln2.hook_normalized", feature_output_hook="hook_mlp_out",
                                      device=torch.device("cpu"), lazy_encoder=False, lazy_decoder=False)
    model = TransformerLensReplacementModel.from_config(cfg, transcoders)
    # the replacement model wraps each MLP and the unembedding (old_mlp, old_unembed); their weights move with them
    state = {re.sub(r"^(blocks\.\d+\.mlp|unembed)\.", lambda m: f"{m[1]}.old_{m[1].split('.')[-1]}.", k): v
             for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    wanted = [k for k in missing if "transcoder" not in k and not k.endswith(("IGNORE", "mask", "rotary_sin",
                                                                               "rotary_cos"))]
    if wanted or unexpected:
        raise SystemExit(f"weights not loaded: missing {wanted[:5]}, unexpected {unexpected[:5]}")
    return model


def main() -> None:
    from circuit_tracer import attribute

    work, case = Path(sys.argv[1]), sys.argv[2]
    settings = json.loads((work / "settings.json").read_text())
    model = model_and_transcoders(work)
    ids = torch.tensor(settings["prompts"][case])
    limit = None if case == "short" else settings["max_feature_nodes"]
    # a third argument: bench_graphs.py's retry at a smaller batch after this ran out of memory
    batch_size = int(sys.argv[3]) if len(sys.argv) > 3 else settings.get("peer_batch_size", settings["batch_size"])
    gc.collect()
    with PeakRSS() as memory:
        started = time.perf_counter()
        graph = attribute(ids, model, max_n_logits=settings["max_n_logits"],
                          desired_logit_prob=settings["desired_logit_prob"], batch_size=batch_size,
                          max_feature_nodes=limit)
        seconds = time.perf_counter() - started
    a = graph.adjacency_matrix
    n_f, k = len(graph.selected_features), len(graph.logit_probabilities)
    rows = torch.cat([a[:n_f], a[a.shape[0] - k:]]).float().contiguous()
    features = graph.active_features[graph.selected_features].long().contiguous()
    tokens = getattr(graph, "logit_tokens", None)
    if tokens is None:
        tokens = torch.tensor([t.vocab_idx for t in graph.logit_targets])
    save_file({"rows": rows, "features": features, "logit_tokens": torch.as_tensor(tokens).long().contiguous()},
              str(work / f"peer_{case}.safetensors"))
    print(json.dumps({"seconds": seconds, "peak_bytes": memory.growth, "n_features": n_f, "n_logits": k,
                      "batch_size": batch_size}))


if __name__ == "__main__":
    main()
