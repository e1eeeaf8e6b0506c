"""Tiny random-weight BERT models (post-LN encoders), saved as local folders with a small WordPiece tokenizer.

Not a test file. `build(variant, folder)` saves the model (safetensors) and a tokenizer.json built here from a
word list (BERT's [CLS] text [SEP] template included), and returns the Hugging Face model in eval mode, float32,
eager attention. Variants: "bert_mlm" (BertForMaskedLM, GELU) and "bert_base" (BertModel: an embedding model,
ReLU so a second activation is covered).
"""

from pathlib import Path

import tokenizers
import torch
import transformers
from tiny_models import _reinit
from tokenizers import models, normalizers, pre_tokenizers, processors

VARIANTS = ["bert_mlm", "bert_base"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a of is in to and was it capital city france paris london rome germany berlin tower eiffel located "
    "mary john went store gave drink . , ! ? cat dog sat on mat sun shines bright today cold warm"
).split()
# WordPiece continuations, so that an unknown word still splits into known pieces
PIECES = ["##s", "##ed", "##ing", "##er", "##ly"] + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
VOCAB = SPECIAL + WORDS + list("abcdefghijklmnopqrstuvwxyz") + PIECES
N_CTX = 64


def tokenizer() -> tokenizers.Tokenizer:
    """A lower-casing WordPiece tokenizer over VOCAB with BERT's template, as a tokenizer.json would hold it."""
    vocab = {token: i for i, token in enumerate(VOCAB)}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    tok.add_special_tokens(SPECIAL)
    return tok


def hf_config(variant: str) -> transformers.BertConfig:
    return transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
        max_position_embeddings=N_CTX, type_vocab_size=2, hidden_act="gelu" if variant == "bert_mlm" else "relu",
        layer_norm_eps=1e-12, pad_token_id=0,
    )


def build(variant: str, folder: Path) -> transformers.PreTrainedModel:
    config = hf_config(variant)
    torch.manual_seed(100 + VARIANTS.index(variant))
    kind = transformers.BertForMaskedLM if variant == "bert_mlm" else transformers.BertModel
    model = kind(config) if variant == "bert_mlm" else kind(config, add_pooling_layer=True)
    model.config._attn_implementation = "eager"
    _reinit(model, seed=2000 + VARIANTS.index(variant))
    if variant == "bert_mlm":
        model.tie_weights()
    model.eval()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer().save(str(folder / "tokenizer.json"))
    return model
