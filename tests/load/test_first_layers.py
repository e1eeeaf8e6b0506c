"""resid.first_layers(model, n): a model of the first n layers, the final norm and the head, sharing the weights;
its logits are the full model's readout of layer n-1's output, its per-layer config fields cut to n layers, and the
model it came from unchanged."""

import pytest
import torch
from random_models import make_random_model

import resid


@pytest.mark.parametrize("kind", ["llama_gqa", "gemma3_like", "neox_parallel"])  # per-layer types; parallel blocks
def test_first_layers_read_out_the_full_models_layer(kind):
    model = make_random_model(kind)
    ids = torch.randint(0, model.config.d_vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    full = model.run(ids)
    for n in range(1, model.config.n_layers + 1):
        small = resid.first_layers(model, n)
        assert small.config.n_layers == len(small.blocks) == n
        assert small.config.layer_types == (None if model.config.layer_types is None else model.config.layer_types[:n])
        run = small.run(ids)
        torch.testing.assert_close(run.stream.resid_post(n - 1), full.stream.resid_post(n - 1), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(run.logits, model.readout.logits(full.stream.resid_post(n - 1)),
                                   rtol=1e-5, atol=1e-5)
        assert small.blocks[0].ln_mlp.w.data_ptr() == model.blocks[0].ln_mlp.w.data_ptr()  # shared, not copied
    assert model.config.n_layers == len(model.blocks) == 3 and torch.equal(model.run(ids).logits, full.logits)


def test_bad_counts_are_one_clear_error(random_model):
    for bad in (0, random_model.config.n_layers + 1, True):
        with pytest.raises(resid.ResidError, match="first_layers keeps 1..3 layers"):
            resid.first_layers(random_model, bad)
