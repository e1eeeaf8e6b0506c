"""BERT against transformers (fp32, eager) on tiny random models: every layer's stream (the normed states each
sublayer reads) and the outputs, on padded batches; padding never changes a prompt's numbers."""

import pytest
import torch
from encoder_models import VOCAB

ATOL = 1e-4
TEXTS = ["Paris is the [MASK] of France.", "the cat sat on the mat", "john gave mary a drink in rome today !"]


def _hf(encoder, tokens):
    with torch.no_grad():
        return encoder.hf(input_ids=tokens.ids, attention_mask=tokens.attention_mask.long(), output_hidden_states=True)


def test_every_layer_and_the_output_match_transformers(bert):
    model = bert.model
    tokens = model.to_tokens(TEXTS, padding_side="right")  # transformers' BERT counts positions from column 0
    assert tokens.ids[:, 0].eq(VOCAB.index("[CLS]")).all(), "texts are wrapped as [CLS] text [SEP]"
    reference = _hf(bert, tokens)
    run = model.run(tokens)
    real = tokens.attention_mask
    for layer, hidden in enumerate(reference.hidden_states):
        torch.testing.assert_close(run.stream.resid_pre(layer)[real], hidden[real], atol=ATOL, rtol=0)
    last = reference.hidden_states[-1]
    torch.testing.assert_close(run.hidden[real], last[real], atol=ATOL, rtol=0)
    if bert.variant == "bert_mlm":
        torch.testing.assert_close(run.logits[real], reference.logits[real], atol=ATOL, rtol=0)
    else:
        assert not run.has_logits
        torch.testing.assert_close(model(tokens)[real], reference.last_hidden_state[real], atol=ATOL, rtol=0)


def test_resid_mid_is_the_normed_state_the_mlp_reads(bert):
    """Post-LN: resid_mid(l) = LN(resid_pre(l) + attn.out), what transformers' intermediate layer reads."""
    model = bert.model
    tokens = model.to_tokens(TEXTS[:1])
    seen = {}
    def record(module, args, output):
        seen["in"] = args[0]

    handle = bert.hf.base_model.encoder.layer[1].intermediate.register_forward_hook(record)
    try:
        _hf(bert, tokens)
    finally:
        handle.remove()
    torch.testing.assert_close(model.run(tokens).stream.resid_mid(1), seen["in"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_changes_nothing(bert, side):
    """Bidirectional attention reads only real tokens and positions count real tokens, so a prompt's states are
    the same alone and in a batch padded on either side."""
    model = bert.model
    batch = model.to_tokens(TEXTS, padding_side=side)
    run = model.run(batch)
    for i, text in enumerate(TEXTS):
        alone = model.run(text)
        real = batch.attention_mask[i]
        torch.testing.assert_close(run.hidden[i][real], alone.hidden[0], atol=1e-5, rtol=0)
        if run.has_logits:
            torch.testing.assert_close(run.logits[i][real], alone.logits[0], atol=1e-5, rtol=0)


def test_config_reads_bert(bert):
    config = bert.model.config
    assert (config.post_ln, config.causal, config.final_norm, config.embed_norm) == (True, False, False, True)
    assert config.head == ("mlm" if bert.variant == "bert_mlm" else "none")
    assert config.act == ("gelu" if bert.variant == "bert_mlm" else "relu")
