"""logits_at computes the unembedding only where asked; resume() continues a run from any layer."""

import pytest
import torch
from numerics import TINY

import resid
from resid import Scale, Site, ZeroAblate

TEXTS = ["The quick brown fox jumps over", "Hello there", "One two"]


@pytest.mark.parametrize("side", ["left", "right"])
def test_logits_at_last_real_token(random_model, side):
    tokens = random_model.to_tokens(TEXTS, padding_side=side)
    full = random_model.run(tokens).logits
    last = random_model.run(tokens, logits_at="last").logits
    index = tokens.last_positions()
    assert last.shape == (3, 1, random_model.config.d_vocab)
    torch.testing.assert_close(last[:, 0], full[torch.arange(3), index])
    some = random_model.run(tokens, logits_at=resid.Padded(torch.tensor([[0, 1], [1, 2], [2, -1]]))).logits
    torch.testing.assert_close(some[2, 1], full[2, -1])


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_tensor_of_positions_is_prompt_relative_like_a_list(random_model, side):
    """logits_at=[-1] and logits_at=tensor([-1, -1, -1]) mean the same on any padding (each prompt's last token);
    a [batch k] tensor gives each prompt its own positions."""
    tokens = random_model.to_tokens(TEXTS, padding_side=side)
    as_list = random_model.run(tokens, logits_at=[-1]).logits
    as_tensor = random_model.run(tokens, logits_at=torch.tensor([-1, -1, -1])).logits
    torch.testing.assert_close(as_tensor, as_list)
    per_prompt = random_model.run(tokens, logits_at=torch.tensor([[0], [-1], [1]])).logits
    for row, position in enumerate([0, -1, 1]):
        alone = random_model.run(TEXTS[row], logits_at=[position]).logits
        torch.testing.assert_close(per_prompt[row], alone[0], **TINY)


def test_resume_equals_full_run_with_the_same_edits(random_model):
    tokens = random_model.to_tokens(TEXTS)
    clean = random_model.run(tokens)
    for layer in range(random_model.config.n_layers):
        edits = [ZeroAblate(Site(layer, "attn", head=1)), Scale(Site(layer, "mlp"), 0.5)]
        full = random_model.run(tokens, interventions=edits, logits_at="last").logits
        resumed = random_model.resume(layer, clean.stream.resid_pre(layer), tokens, edits, logits_at="last")
        torch.testing.assert_close(resumed, full, atol=1e-5, rtol=1e-5)


def test_resume_bad_input(random_model):
    tokens = random_model.to_tokens(TEXTS)
    resid_pre = random_model.run(tokens).stream.resid_pre(1)
    with pytest.raises(resid.ResidError, match="come before layer 1"):
        random_model.resume(1, resid_pre, tokens, [ZeroAblate(Site(0, "mlp"))])
    with pytest.raises(resid.ResidError, match=r"resume got resid_pre of shape \(3, 2, 32\), but the tokens need \(3, "
                                               r"6, 32\)"):
        random_model.resume(1, resid_pre[:, :2], tokens)
    with pytest.raises(resid.ResidError, match="out of range"):
        random_model.resume(9, resid_pre, tokens)
    with pytest.raises(resid.ResidError, match=r"logits_at must be None, 'last', a list of positions, a tensor of "
                                               r"positions or resid\.Padded\(index\), got 'first'"):
        random_model.run(tokens, logits_at="first")
