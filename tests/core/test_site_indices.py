"""Every index of a Site (layer, head, kv_head, neuron, expert) is checked against the model where a run reads it
and where an intervention resolves it: an index past the model is one ResidError naming the site, the model's
count and the valid range, never an IndexError from deep in the stream."""

import pytest
import torch
from moe_models import make_moe_model
from random_models import make_random_model

import resid
from resid import Capture, Site, ZeroAblate
from resid.errors import ResidError

IDS = torch.tensor([[5, 6, 7, 8, 9]])

# (site, what the message must say): llama_gqa has 3 layers, 4 heads, 2 key/value heads, 64 neurons
DENSE = [
    (Site(1, "attn", head=99), r"layers\[1\]\.attn\.head\[99\]: head 99 is out of range; the model has 4 heads "
                               r"\(0\.\.3, or -4\.\.-1\)"),
    (Site(1, "attn", head=-5, field="q"), r"head -5 is out of range; the model has 4 heads"),
    (Site(1, "attn", head=4, field="pattern"), r"head 4 is out of range; the model has 4 heads"),
    (Site(0, "attn", kv_head=2, field="k"), r"kv_head 2 is out of range; the model has 2 key/value heads"),
    (Site(2, "mlp", neuron=64), r"neuron 64 is out of range; the model has 64 MLP neurons"),
    (Site(2, "mlp", neuron=70, field="gate"), r"neuron 70 is out of range; the model has 64 MLP neurons"),
    (Site(3, "attn"), r"layers\[3\]\.attn: layer 3 is out of range; the model has 3 layers"),
    (Site(-4, "resid_pre"), r"layer -4 is out of range; the model has 3 layers"),
]


@pytest.fixture(scope="module")
def llama() -> resid.Transformer:
    return make_random_model("llama_gqa")


@pytest.mark.parametrize(("site", "message"), DENSE, ids=[site.label for site, _ in DENSE])
def test_read_and_edit_out_of_range(llama, site, message):
    run = llama.run(IDS, capture=Capture.all())
    with pytest.raises(ResidError, match=message):
        run.read(site)
    with pytest.raises(ResidError, match=message):  # resolved before the field is checked as editable
        llama.run(IDS, interventions=[ZeroAblate(site)])


def test_experts_out_of_range():
    model = make_moe_model()  # 2 layers of 4 experts with 24 neurons each
    run = model.run(IDS, capture=Capture.all())
    for site, message in [(Site(1, "mlp", expert=4), r"expert 4 is out of range; the model has 4 experts"),
                          (Site(1, "mlp", expert=1, neuron=24), r"neuron 24 is out of range; the model has 24 MLP")]:
        with pytest.raises(ResidError, match=message):
            run.read(site)
        with pytest.raises(ResidError, match=message):
            model.run(IDS, interventions=[ZeroAblate(site)])
    assert run.read(Site(1, "mlp", expert=-1)).shape == (1, 5, 32)


def test_negative_indices_read_from_the_end(llama):
    run = llama.run(IDS, capture=Capture.all())
    assert torch.equal(run.read(Site(-1, "attn", head=-1)), run.stream.layers[2].attn.z[:, :, 3])
    assert torch.equal(run.read(Site(1, "attn", kv_head=-2, field="v")), run.stream.layers[1].attn.v[:, :, 0])


def test_stopped_run_counts_its_own_layers(llama):
    """After stop_at_layer, -1 is the last layer run, and a layer past it names the run's count."""
    run = llama.run(IDS, capture=Capture.all(), stop_at_layer=2)
    assert torch.equal(run.read(Site(-1, "attn")), run.stream.layers[1].attn.out)
    with pytest.raises(ResidError, match=r"layer 2 is out of range; the model has 2 layers in this run "
                                         r"\(stop_at_layer\)"):
        run.read(Site(2, "mlp"))


def test_a_logit_token_out_of_range(llama):
    run = llama.run(IDS)
    vocab = run.logits.shape[-1]
    with pytest.raises(ResidError, match=rf"token 1000000 is out of range; the vocabulary has {vocab} tokens .*"
                                         r"to_single_token"):
        run.read(Site(None, "logits", token=10**6))
    assert torch.equal(run.read(Site(None, "logits", token=vocab - 1)), run.logits[..., -1])
