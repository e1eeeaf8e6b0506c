"""A prompt gives the same logits at its real positions alone as inside a left- or right-padded batch, to the
tolerance the README states: 1e-5 of the largest logit on the tiny random models, 1e-4 on SmolLM2 (measured 1.2e-6
and 3.4e-6 on a 2-core CPU). Not bitwise: a batch's matrix products sum in another order than one row's."""

import pytest
import torch

PROMPTS = [
    "The Eiffel Tower is located in the city of",
    "Hi",
    "When Mary and John went to the store, John gave a drink to",
    "1 2 3",
]


def _check_padding(model, atol):
    alone = [model.run(text).logits[0] for text in PROMPTS]
    for side in ("left", "right"):
        tokens = model.to_tokens(PROMPTS, padding_side=side)
        batch = model.run(tokens).logits
        for row, logits in enumerate(alone):
            real = tokens.attention_mask[row]
            assert int(real.sum()) == logits.shape[0]
            # fp32 batched GEMMs round differently from single-row ones: tolerance relative to the logit scale
            scale = max(1.0, logits.abs().max().item())
            torch.testing.assert_close(batch[row][real], logits, atol=atol * scale, rtol=0)


def test_padding_invariance_random(random_model):
    _check_padding(random_model, atol=1e-5)


def test_padding_invariance_smollm2(smollm2):
    _check_padding(smollm2, atol=1e-4)


@pytest.mark.parametrize("side", ["left", "right"])
def test_tokens_masks_and_positions(gpt2_tokenizer, side):
    tokens = gpt2_tokenizer.to_tokens(["Hello world", "Hi"], padding_side=side)
    assert tokens.ids.shape == (2, 2)
    assert gpt2_tokenizer.encode("Hello world") == [15496, 995]
    expected_mask = [[True, True], [False, True]] if side == "left" else [[True, True], [True, False]]
    assert tokens.attention_mask.tolist() == expected_mask
    assert tokens.position_ids[0].tolist() == [0, 1]
    assert tokens.position_ids[1][tokens.attention_mask[1]].tolist() == [0]
    assert tokens.last_positions().tolist() == [1, 1 if side == "left" else 0]


def test_bos_policy(gpt2_tokenizer):
    assert gpt2_tokenizer.encode("Hello", prepend_bos=True) == [50256, 15496]
    assert gpt2_tokenizer.to_tokens("Hello", prepend_bos=True).ids.tolist() == [[50256, 15496]]
    assert gpt2_tokenizer.to_str_tokens("Hello world") == ["Hello", " world"]
