"""Encoder sites: Site(..., stack="encoder") prints as "encoder.<label>" and parses back, every other label is
unchanged; EncoderDecoder.run routes interventions on encoder sites to the encoder (equal to a hand-written torch
hook on the Hugging Face Marian model) and Seq2SeqRun.read reads them from the encoder's run; decoder-only models
and a decoder on its own refuse them, saying why."""

import pytest
import torch
from random_models import make_random_model
from seq2seq_models import PAD

import resid
from resid import Site
from resid.errors import ResidError

SOURCES = torch.randint(1, PAD, (3, 7), generator=torch.Generator().manual_seed(21))
TARGETS = torch.randint(1, PAD, (3, 4), generator=torch.Generator().manual_seed(22))


@pytest.mark.parametrize(("site", "label"), [
    (Site(2, "attn", head=1, stack="encoder"), "encoder.layers[2].attn.head[1]"),
    (Site(0, "mlp", stack="encoder"), "encoder.layers[0].mlp"),
    (Site(1, "resid_pre", positions=(-1,), stack="encoder"), "encoder.layers[1].resid_pre@-1"),
    (Site(None, "embed", stack="encoder"), "encoder.embed"),
    (Site(1, "mlp", neuron=3, field="pre", stack="encoder"), "encoder.layers[1].mlp.neuron[3].pre"),
    (Site(2, "cross", head=1), "layers[2].cross.head[1]"),
    (Site(2, "attn", head=1, stack="decoder"), "layers[2].attn.head[1]"),
])
def test_labels_round_trip(site, label):
    assert site.label == label
    assert Site.parse(label) == site


def test_a_stack_is_encoder_or_the_default():
    assert Site(0, "mlp", stack="decoder") == Site(0, "mlp")
    with pytest.raises(ResidError, match="stack must be 'encoder'"):
        Site(0, "mlp", stack="middle")


def _hf(tiny_marian, module, hook, pre=False):
    register = module.register_forward_pre_hook if pre else module.register_forward_hook
    handle = register(hook)
    try:
        with torch.no_grad():
            return tiny_marian.hf(input_ids=SOURCES, decoder_input_ids=TARGETS).logits
    finally:
        handle.remove()


def test_an_encoder_mlp_ablation_equals_a_torch_hook(tiny_marian):
    edit = resid.ZeroAblate(Site.parse("encoder.layers[0].mlp"))
    ablated = tiny_marian.model.run(SOURCES, TARGETS, interventions=[edit])
    expected = _hf(tiny_marian, tiny_marian.hf.model.encoder.layers[0].fc2, lambda m, i, out: torch.zeros_like(out))
    clean = tiny_marian.model.run(SOURCES, TARGETS).logits
    assert (clean - expected).abs().max() > 1e-2  # the ablation matters
    torch.testing.assert_close(ablated.logits, expected, atol=1e-5, rtol=1e-5)


def test_an_encoder_head_ablation_equals_a_torch_hook(tiny_marian):
    d_head = tiny_marian.model.encoder.config.d_head

    def zero_head(module, inputs):
        z = inputs[0].clone()
        z[..., 2 * d_head : 3 * d_head] = 0
        return (z,)

    site = Site(1, "attn", head=2, stack="encoder")
    ablated = tiny_marian.model.run(SOURCES, TARGETS, interventions=[resid.ZeroAblate(site)])
    expected = _hf(tiny_marian, tiny_marian.hf.model.encoder.layers[1].self_attn.out_proj, zero_head, pre=True)
    torch.testing.assert_close(ablated.logits, expected, atol=1e-5, rtol=1e-5)


def test_encoder_sites_are_read_from_the_encoder(tiny_marian):
    model = tiny_marian.model
    run = model.run(SOURCES, TARGETS, capture=resid.Capture.all(), encoder_capture=resid.Capture.all())
    torch.testing.assert_close(run.read(Site.parse("encoder.layers[1].attn.head[2]")),
                               run.encoder.stream.layers[1].attn.z[:, :, 2])
    torch.testing.assert_close(run.read(Site.parse("layers[1].cross.head[1]")), run.stream.layers[1].cross.z[:, :, 1])
    # the encoder site and the encoder_interventions spelling are the same edit
    site = Site(0, "attn", stack="encoder")
    a = model.run(SOURCES, TARGETS, interventions=[resid.Scale(site, 0.5)]).logits
    b = model.run(SOURCES, TARGETS, encoder_interventions=[resid.Scale(Site(0, "attn"), 0.5)]).logits
    c = model.run(SOURCES, TARGETS, encoder_interventions=[resid.Scale(site, 0.5)]).logits
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    torch.testing.assert_close(a, c, atol=0, rtol=0)


def test_bad_encoder_sites_say_what_is_wrong(tiny_marian, gpt2_tokenizer):
    model = tiny_marian.model
    decoder_only = make_random_model("gpt2_like", gpt2_tokenizer)
    encoder_site = Site.parse("encoder.layers[0].mlp")
    with pytest.raises(ResidError, match=r"encoder\.layers\[0\]\.mlp is a site of an encoder-decoder model's encoder"):
        decoder_only.run("hello", interventions=[resid.ZeroAblate(encoder_site)])
    with pytest.raises(ResidError, match="this model has no encoder"):
        model.decoder.run(TARGETS, interventions=[resid.ZeroAblate(encoder_site)], memory=model.memory(
            model.encode(SOURCES)))
    with pytest.raises(ResidError, match=r"encoder\.layers\[5\]\.mlp: layer 5 is out of range"):
        model.run(SOURCES, TARGETS, interventions=[resid.ZeroAblate(Site(5, "mlp", stack="encoder"))])
    with pytest.raises(ResidError, match=r"encoder\.layers\[0\]\.cross: this model has no cross-attention"):
        model.run(SOURCES, TARGETS, interventions=[resid.ZeroAblate(Site(0, "cross", stack="encoder"))])
    with pytest.raises(ResidError, match="not of this stream"):
        decoder_only.run("hello").read(encoder_site)
    with pytest.raises(ResidError, match="no TransformerLens hook name"):
        encoder_site.hook_name  # noqa: B018
