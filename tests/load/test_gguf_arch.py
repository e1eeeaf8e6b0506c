"""GGUF files of every architecture resid reads (llama, qwen2, qwen3, gemma3), tiny and random, load to the
same logits as transformers gives for the same weights; test_gguf_arch_errors.py reuses `build`, `write_gguf`.

The files are written the way llama.cpp's convert_hf_to_gguf.py writes them. The tensor names come from the gguf
package's own name map (gguf.get_tensor_name_map), independent of resid's table; the converter's value changes
are redone here: llama's Q/K rows (and biases) permuted per head, Gemma 3's norm gains stored as 1 + w. Tensors
stay float32, so the GGUF holds exactly the Hugging Face weights. Vocabularies: GPT-2's byte-level BPE for
llama/qwen2/qwen3, a small SentencePiece-style one (`SPM_TOKENS`) for gemma3.
"""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

import resid

GPT2_TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "gpt2-tokenizer" / "tokenizer.json"
N_CTX = 128
_BASE = dict(
    hidden_size=48, num_attention_heads=4, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=N_CTX
)

# A SentencePiece-style vocabulary as llama.cpp writes Gemma's: control tokens, byte pieces, "▁" for spaces,
# runs of real spaces and newlines as user-defined tokens.
_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
_PIECES = [
    "▁", "▁t", "he", "▁the", "▁a", "in", "▁in", "er", "▁c", "at", "▁cat", "▁s", "at▁", "on", "▁on", "an", "▁an",
    "is", "▁is", "ap", "ca", "pi", "tal", "▁cap", "ital", "▁capital", "▁of", "of", "▁F", "ra", "nce", "▁France",
    "▁Paris", "12", "3", "é", "▁café", "hello", "▁world", "wor", "ld", "▁▁", "ing",
]
_USER = ["\n", "\n\n", "  ", "   ", "[multimodal]"]
SPM_TOKENS = _CONTROL + [f"<0x{b:02X}>" for b in range(256)] + _PIECES + _USER
_SPM_TYPES = [3] * len(_CONTROL) + [6] * 256 + [1] * len(_PIECES) + [4] * len(_USER)

_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
         "gemma3": gguf.MODEL_ARCH.GEMMA3}
VARIANTS = ["llama", "qwen2", "qwen3", "gemma3"]


def hf_config(variant: str) -> transformers.PretrainedConfig:
    gpt2_vocab = dict(_BASE, vocab_size=50257, rms_norm_eps=1e-6)
    if variant == "llama":  # GQA, biases (permuted too), untied, a distinctive base
        return transformers.LlamaConfig(
            **gpt2_vocab, num_key_value_heads=2, attention_bias=True, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        )
    if variant == "llama_plain":  # what transformers' GGUF config can describe: no biases
        return transformers.LlamaConfig(**gpt2_vocab, num_key_value_heads=2, tie_word_embeddings=False)
    if variant == "qwen2":
        return transformers.Qwen2Config(**gpt2_vocab, num_key_value_heads=2, tie_word_embeddings=False,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    if variant == "qwen3":  # head_dim 16 != 48 / 4, tied
        return transformers.Qwen3Config(**gpt2_vocab, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if variant == "gemma3":  # 6 layers: five sliding (window 4), one global with linearly scaled rope
        rope = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        return transformers.Gemma3TextConfig(
            **dict(_BASE, num_hidden_layers=6, num_attention_heads=2), num_key_value_heads=1, head_dim=32,
            query_pre_attn_scalar=32, vocab_size=len(SPM_TOKENS), sliding_window=4, rope_parameters=rope,
            rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        )
    raise ValueError(variant)


def build_hf(variant: str) -> transformers.PreTrainedModel:
    seed = (VARIANTS + ["llama_plain"]).index(variant)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_config(variant), attn_implementation="eager", dtype=torch.float32
    )
    generator = torch.Generator().manual_seed(100 + seed)
    gemma = variant == "gemma3"  # stores gain - 1
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=generator)
                is_gain = "Norm" in type(module).__name__ and name == "weight"
                param.copy_((0.0 if gemma else 1.0) + 0.2 * noise if is_gain else 0.15 * noise)
    return model.eval()


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's LlamaModel.permute: rotary pairs (i, i + d/2) become adjacent rows.
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape
    )


def write_gguf(model: transformers.PreTrainedModel, variant: str, path: Path, skip: tuple[str, ...] = (),
               extra: dict[str, np.ndarray] | None = None, pre: str = "gpt-2") -> Path:
    """Write `model` as llama.cpp would; tensors named in `skip` are left out, `extra` ones added; `pre` is the
    byte-level vocabulary's pre-tokenizer name."""
    cfg = model.config
    variant = variant.split("_")[0]  # llama_plain is written as llama
    arch = gguf.MODEL_ARCH_NAMES[_ARCH[variant]]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    if variant == "llama":
        writer.add_rope_dimension_count(head_dim)
    if variant == "gemma3":
        writer.add_sliding_window(cfg.sliding_window)
    _write_vocab(writer, variant, pre)
    names = gguf.get_tensor_name_map(_ARCH[variant], cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes output.weight only when untied
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        data = tensor.detach().float().numpy().copy()
        if variant == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            data = _permute(data, cfg.num_attention_heads)
        if variant == "llama" and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            data = _permute(data, cfg.num_key_value_heads)
        if variant == "gemma3" and hf_name.endswith("norm.weight"):
            data = data + 1.0  # Gemma3Model.norm_shift
        if name not in skip:
            writer.add_tensor(name, data)
    for name, data in (extra or {}).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_vocab(writer: gguf.GGUFWriter, variant: str, pre: str) -> None:
    if variant == "gemma3":
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(SPM_TOKENS)
        writer.add_token_scores([-1000.0 if kind == 3 else -float(i) for i, kind in enumerate(_SPM_TYPES)])
        writer.add_token_types(_SPM_TYPES)
        writer.add_bos_token_id(2)
        writer.add_eos_token_id(1)
        writer.add_unk_token_id(3)
        writer.add_pad_token_id(0)
        writer.add_add_bos_token(True)
        writer.add_add_space_prefix(False)
        return
    spec = json.loads(GPT2_TOKENIZER.read_text())["model"]
    tokens = sorted(spec["vocab"], key=spec["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t == "<|endoftext|>" else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(50256)
    writer.add_eos_token_id(50256)


def build(variant: str, folder: Path) -> tuple[transformers.PreTrainedModel, Path]:
    """The Hugging Face model (the oracle) and its GGUF file in `folder`."""
    model = build_hf(variant)
    folder.mkdir(parents=True, exist_ok=True)
    return model, write_gguf(model, variant, folder / f"tiny-{variant}.gguf")


# --- the tests: resid's logits from the GGUF equal transformers' from the same weights ---

ATOL = 1e-4


@pytest.fixture(scope="module", params=VARIANTS)
def tiny_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    model, path = build(request.param, tmp_path_factory.mktemp(f"gguf_{request.param}"))
    return request.param, model, path


def test_logits_match_transformers(tiny_gguf) -> None:
    variant, hf, path = tiny_gguf
    ids = torch.randint(0, hf.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    model = resid.load(path)
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(model.run(ids).logits, expected, atol=ATOL, rtol=0)
    assert model.config.architecture == hf.config.model_type


def test_config_read_from_metadata(tiny_gguf) -> None:
    variant, hf, path = tiny_gguf
    config = resid.load(path).config
    cfg = hf.config
    assert (config.n_layers, config.d_model, config.n_heads, config.n_kv_heads) == (
        cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
    )
    assert config.d_head == (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    assert config.tie_embeddings == cfg.tie_word_embeddings and config.d_vocab == cfg.vocab_size
    if variant == "gemma3":
        assert config.layer_types == ("sliding",) * 5 + ("full",)
        assert (config.sliding_window, config.rotary_base, config.rotary_base_local) == (4, 1e6, 10000.0)
        assert config.rope_scaling is not None and config.rope_scaling.factor == 4.0
        assert config.attn_scale == pytest.approx(32**-0.5) and config.qk_norm == "head"
    if variant == "qwen3":
        assert config.qk_norm == "head"
    if variant in ("llama", "qwen2"):
        assert config.attn_qkv_bias


@pytest.mark.slow  # transformers' GGUF loader builds its model (7 s each)
@pytest.mark.parametrize("variant", ["llama_plain", "qwen2"])
def test_writer_agrees_with_transformers_gguf_loader(tmp_path, variant: str) -> None:
    """The oracle for the writer's conventions (llama's Q/K permutation, the names): transformers' own GGUF
    loader reads the tiny file back to the same logits. Only where transformers' GGUF config describes the model:
    it reads no attention biases for llama, no head_dim for qwen3 (it takes 128) and, for gemma3, no rope
    scaling and query_pre_attn_scalar = 256 whatever the file says (right for every released Gemma 3 but 27B)."""
    hf, path = build(variant, tmp_path)
    transformers.utils.logging.disable_progress_bar()
    back = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, attn_implementation="eager", dtype=torch.float32
    ).eval()
    ids = torch.randint(0, hf.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, hf(ids).logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(resid.load(path).run(ids).logits, hf(ids).logits, atol=ATOL, rtol=0)
