"""resid.readout: the one path from the residual stream to logits and back. Frozen and recomputed scales,
directions that sum exactly, the folded unembedding, and the norm algebra it is built from."""

import pytest
import torch
from random_models import RANDOM_CONFIGS, make_random_model

from resid.readout import Direction

TEXTS = ["The quick brown fox jumps", "over the lazy dog"]


@pytest.fixture(params=sorted(RANDOM_CONFIGS))
def model(request):
    return make_random_model(request.param)


def _ids(model):
    return torch.randint(0, model.config.d_vocab, (2, 7), generator=torch.Generator().manual_seed(1))


def test_logits_of_the_final_residual_are_the_models(model):
    run = model.run(_ids(model))
    final = run.stream.final()
    torch.testing.assert_close(model.readout.logits(final), run.logits, atol=1e-5, rtol=1e-5)
    # the frozen scale is the one the forward used, so on the final residual both agree
    torch.testing.assert_close(model.readout.logits(final, run.stream.final_norm_scale), run.logits, atol=1e-5,
                               rtol=1e-5)


def test_frozen_scale_makes_the_readout_affine(model):
    run = model.run(_ids(model))
    scale = run.stream.final_norm_scale
    a, b = torch.randn(2, *run.stream.final().shape, generator=torch.Generator().manual_seed(2))
    readout = model.readout

    def logits(x):  # before a final soft cap (Gemma 2), which is not affine; readout.logits applies it
        return readout.unembed.raw(readout.normalize(x, scale)[0])

    torch.testing.assert_close(readout.unembed.cap(logits(a)), readout.logits(a, scale), atol=1e-6, rtol=0)
    zero = logits(torch.zeros_like(a))
    combined = logits(a + b) - zero
    torch.testing.assert_close(combined, (logits(a) - zero) + (logits(b) - zero), atol=1e-4, rtol=1e-4)
    # recomputing the scale is not affine in general (the scale depends on the input)
    assert not torch.allclose(readout.logits(2 * a), 2 * readout.logits(a) - readout.logits(torch.zeros_like(a)))


def test_logit_direction_sums_writes_to_the_logit_difference(model):
    run = model.run(_ids(model))
    _, writes = run.stream.components()
    target, baseline = torch.tensor([3, 5]), torch.tensor([11, 2])
    direction = model.readout.logit_direction(target, run.stream.final_norm_scale[:, -1], baseline)
    total = sum(direction.project(w[:, -1]) for w in writes) + direction.bias
    rows = torch.arange(2)
    logits = run.logits if run.uncapped_logits is None else run.uncapped_logits  # directions are before a cap
    expected = logits[rows, -1, target] - logits[rows, -1, baseline]
    torch.testing.assert_close(total, expected, atol=1e-4, rtol=1e-4)


def test_through_equals_projecting_the_weights_rows(model):
    run = model.run(_ids(model))
    direction = model.readout.logit_direction([1, 2], run.stream.final_norm_scale[:, -1])
    w_o = model.blocks[0].attn.W_O.detach()
    pulled = direction.through(w_o)  # [batch head d_head]
    by_hand = torch.einsum("hed,bd->bhe", w_o.float(), direction.vector)
    torch.testing.assert_close(pulled, by_hand)


def test_vector_logits_match_the_folded_unembedding(model):
    vectors = model.blocks[0].mlp.W_out[:5].detach()
    readout = model.readout
    torch.testing.assert_close(readout.vector_logits(vectors), vectors @ readout.unembedding(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(readout.vector_logits(vectors, through_norm=False), vectors @ model.unembed.W_U.float())


def test_fold_is_the_adjoint_of_the_norms_linear_part(model):
    norm = model.ln_final
    x, u = torch.randn(2, 4, model.config.d_model, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close((norm.linear(x) * u).sum(-1), (x * norm.fold(u)).sum(-1), atol=1e-4, rtol=1e-4)


def test_direction_for_any_vector(model):
    """A probe direction u read after the final norm is exact as a direction on the residual."""
    run = model.run(_ids(model))
    u = torch.randn(2, model.config.d_model, generator=torch.Generator().manual_seed(4))
    scale = run.stream.final_norm_scale[:, -1]
    direction = model.readout.direction(u, scale)
    assert isinstance(direction, Direction)
    normalized, _ = model.readout.normalize(run.stream.final()[:, -1], scale)
    torch.testing.assert_close(direction.project(run.stream.final()[:, -1]) + direction.bias,
                               (normalized.float() * u).sum(-1), atol=1e-4, rtol=1e-4)
