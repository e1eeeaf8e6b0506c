"""run(stop_at_layer=L) runs layers 0..L-1 only: the stream it records equals a full run's up to there, its hidden
state is the residual after layer L-1, there are no logits, and interventions past the stop are refused."""

import pytest
import torch
from random_models import make_random_model

import resid
from resid.errors import ResidError

IDS = torch.randint(0, 97, (3, 9), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kind", ["llama_gqa", "gpt2_like", "gemma3_like"])
@pytest.mark.parametrize("stop", [0, 1, 2])
def test_the_stream_equals_a_full_runs_up_to_the_stop(kind, stop):
    model = make_random_model(kind)
    tokens = resid.Tokens.pad([row[:n].tolist() for row, n in zip(IDS, [9, 5, 7])], 0, "right")
    capture = resid.Capture.all()
    full = model.run(tokens, capture=capture)
    part = model.run(tokens, capture=capture, stop_at_layer=stop)
    assert not part.has_logits and len(part.stream.layers) == stop
    after = full.stream.resid_pre(stop) if stop < model.config.n_layers else full.stream.final()
    torch.testing.assert_close(part.hidden, after, atol=1e-6, rtol=1e-6)
    for layer in range(stop):
        torch.testing.assert_close(part.stream.resid_post(layer), full.stream.resid_post(layer), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(part.stream.layers[layer].attn.pattern, full.stream.layers[layer].attn.pattern)


def test_all_layers_is_a_full_run():
    model = make_random_model("llama_gqa")
    torch.testing.assert_close(model.run(IDS, stop_at_layer=3).logits, model.run(IDS).logits)


def test_bad_stops_and_interventions_past_the_stop_are_refused():
    model = make_random_model("llama_gqa")
    for bad in (-1, 4, True):
        with pytest.raises(ResidError, match=r"stop_at_layer=.* must be a whole number of layers in 0\.\.3 .*or None "
                                             r"to run them all"):
            model.run(IDS, stop_at_layer=bad)
    with pytest.raises(ResidError, match=r"layer\(s\) \[2\] lie past stop_at_layer=2"):
        model.run(IDS, stop_at_layer=2, interventions=[resid.ZeroAblate(resid.Site(2, "mlp"))])
    model.run(IDS, stop_at_layer=2, interventions=[resid.ZeroAblate(resid.Site(1, "mlp"))])  # before the stop: fine
