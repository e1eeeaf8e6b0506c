"""Patching encoder-decoder models with source= and corrupt_source=: exact activation patching equals the Hugging
Face Marian run on the base pair with a hand-written torch hook putting in the other pair's activation (decoder
self and cross heads, decoder MLP, encoder heads and MLP); AtP equals its linear approximation taken by hand with
autograd; a padded batch equals its pairs one at a time; bad input says what to pass."""

import pytest
import torch
from seq2seq_words import worded_marian

import resid
from resid import Site
from resid.analyses import Execution, patching
from resid.errors import ResidError

CLEAN_SOURCES = ["w3 w9 w14 w2 w40", "w7 w8 w1 w5 w6", "w11 w30 w5 w22 w9"]
CORRUPT_SOURCES = ["w3 w9 w15 w2 w40", "w7 w8 w1 w50 w6", "w12 w30 w5 w22 w9"]  # one word changed each
TARGETS = ["w4 w21 w8", "w9 w13 w2", "w33 w1 w17"]
TARGET = "w5"
SITES = ["layers[0].attn.head[1]", "layers[1].cross.head[0]", "layers[2].mlp", "encoder.layers[1].attn.head[2]",
         "encoder.layers[0].mlp"]


@pytest.fixture(scope="module")
def worded(tmp_path_factory):
    return worded_marian(tmp_path_factory.mktemp("worded"))


def _ids(model, texts) -> torch.Tensor:
    return model.as_tokens(texts).ids  # equal lengths: no padding


def _modules(hf, site: Site):
    stack = hf.model.encoder if site.stack else hf.model.decoder
    layer = stack.layers[site.layer]
    if site.part == "mlp":
        return layer.fc2, False
    return (layer.encoder_attn if site.part == "cross" else layer.self_attn).out_proj, True


def _hf_patched(worded, label: str, base_sources, donor_sources) -> torch.Tensor:
    """The target's logit of the Hugging Face model on (base sources, TARGETS), with the donor pair's activation at
    `label` put in by a torch hook (a head: its slice of out_proj's input; an MLP: fc2's output)."""
    hf, model = worded
    site = Site.parse(label)
    module, pre = _modules(hf, site)
    d_head = (model.encoder if site.stack else model.decoder).config.d_head
    heads = slice(None) if site.head is None else slice(site.head * d_head, (site.head + 1) * d_head)
    kept = {}

    def keep(m, *args):
        kept["value"] = (args[0][0] if pre else args[1]).detach().clone()

    def put(m, *args):
        value = (args[0][0] if pre else args[1]).clone()
        value[..., heads] = kept["value"][..., heads]
        return (value,) if pre else value

    target_ids = _ids(model.decoder, TARGETS)
    target = model.decoder.tokenizer.encode(TARGET)[0]
    with torch.no_grad():
        for fn, sources in ((keep, donor_sources), (put, base_sources)):
            handle = (module.register_forward_pre_hook if pre else module.register_forward_hook)(fn)
            try:
                logits = hf(input_ids=_ids(model.encoder, sources), decoder_input_ids=target_ids).logits
            finally:
                handle.remove()
    return logits[:, -1, target]


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_exact_patching_equals_a_torch_hook_per_site(worded, direction):
    model = worded[1]
    df = patching.activation(model, TARGETS, TARGETS, TARGET, sites=SITES, source=CLEAN_SOURCES,
                             corrupt_source=CORRUPT_SOURCES, metric="logit", direction=direction)
    assert df.site.unique().tolist() == SITES
    base, donor = (CORRUPT_SOURCES, CLEAN_SOURCES) if direction == "denoise" else (CLEAN_SOURCES, CORRUPT_SOURCES)
    for label in SITES:
        got = torch.tensor(df[df.site == label].sort_values("prompt_idx").patched_metric.to_numpy()).float()
        torch.testing.assert_close(got, _hf_patched(worded, label, base, donor), atol=1e-4, rtol=1e-4, msg=label)
    # only the source differs: the decoder's first self-attention reads no source, so patching it changes nothing
    first = df[df.site == "layers[0].attn.head[1]"]
    base_metric = first.corrupt_metric if direction == "denoise" else first.clean_metric
    assert (first.patched_metric - base_metric).abs().max() < 1e-5
    assert (df.clean_metric - df.corrupt_metric).abs().min() > 1e-4


def test_the_default_sites_are_the_residual_stream_of_both_stacks(worded):
    model = worded[1]
    df = patching.activation(model, TARGETS[:1], TARGETS[:1], TARGET, source=CLEAN_SOURCES[:1],
                             corrupt_source=CORRUPT_SOURCES[:1])
    encoder, decoder = model.encoder.config.n_layers, model.decoder.config.n_layers
    assert len(df) == encoder * 5 + decoder * 3  # layers x positions of each side
    assert df.site.iloc[0] == "encoder.layers[0].resid_pre@0"
    # patching the whole source's embedding restores the clean run: per position, the unchanged words do nothing
    unchanged = df[df.site == "encoder.layers[0].resid_pre@0"]
    assert unchanged.score.abs().max() < 1e-4
    changed = df[df.site == "encoder.layers[0].resid_pre@2"]
    assert changed.score.abs().min() > 1e-3


def test_atp_equals_its_linear_approximation_by_hand(worded):
    model = worded[1]
    sites = ["layers[1].cross", "encoder.layers[0].mlp", "layers[2].cross.head[1]", "encoder.layers[1].attn.head[0]"]
    est = patching.atp(model, TARGETS, TARGETS, TARGET, sites=["sublayer", "head"], source=CLEAN_SOURCES,
                       corrupt_source=CORRUPT_SOURCES, metric="logit")
    assert set(sites) <= set(est.site)
    assert {"encoder.layers[0].attn.head[0]", "layers[0].mlp", "layers[2].cross"} <= set(est.site)
    target = model.decoder.tokenizer.encode(TARGET)[0]
    everything = dict(capture=resid.Capture.all(), encoder_capture=resid.Capture.all())
    for label in sites:
        site = Site.parse(label)
        clean = model.run(CLEAN_SOURCES, TARGETS, **everything).read(site)
        corrupt = model.run(CORRUPT_SOURCES, TARGETS, **everything).read(site)
        alpha = torch.zeros(len(TARGETS), *([1] * (clean.ndim - 1)), requires_grad=True)
        step = resid.Hook(site, lambda x, tokens: x + alpha * (clean - corrupt))
        metric = model.run(CORRUPT_SOURCES, TARGETS, interventions=[step], grad=True).logits[:, -1, target]
        slope = torch.autograd.grad(metric.sum(), alpha)[0].flatten()
        got = torch.tensor(est[est.site == label].sort_values("prompt_idx").patched_metric.to_numpy()).float()
        torch.testing.assert_close(got, (metric + slope).detach(), atol=1e-4, rtol=1e-4, msg=label)


@pytest.mark.parametrize("method", ["exact", "atp"])
def test_a_padded_batch_equals_its_pairs_one_at_a_time(worded, method):
    model = worded[1]
    clean = ["w3 w9 w14", "w7 w8 w1 w5 w6 w2", "w11"]
    corrupt = ["w3 w9 w15", "w7 w8 w1 w50 w6 w2", "w12"]
    targets = ["w4 w21", "w9", "w33 w1 w17 w3"]
    run = patching.activation if method == "exact" else patching.atp
    options = dict(sites=SITES) if method == "exact" else dict(sites="head")
    batch = run(model, targets, targets, TARGET, source=clean, corrupt_source=corrupt, metric="logit", **options)
    for i in range(3):
        alone = run(model, targets[i : i + 1], targets[i : i + 1], TARGET, source=clean[i : i + 1],
                    corrupt_source=corrupt[i : i + 1], metric="logit", **options)
        mine = batch[batch.prompt_idx == i]
        assert mine.site.tolist() == alone.site.tolist()
        torch.testing.assert_close(torch.tensor(mine.patched_metric.to_numpy()),
                                   torch.tensor(alone.patched_metric.to_numpy()), atol=1e-4, rtol=1e-4)


def test_bad_input_says_what_to_pass(worded):
    model = worded[1]
    with pytest.raises(ResidError, match="encoder-decoder model: pass source="):
        patching.activation(model, TARGETS, TARGETS, TARGET)
    with pytest.raises(ResidError, match="corrupt_source goes with source"):
        patching.atp(model, TARGETS, TARGETS, TARGET, corrupt_source=CORRUPT_SOURCES)
    with pytest.raises(ResidError, match="2 sources for 3 prompts"):
        patching.activation(model, TARGETS, TARGETS, TARGET, source=CLEAN_SOURCES[:2])
    with pytest.raises(ResidError, match="2 corrupt sources for 3 pairs"):
        patching.activation(model, TARGETS, TARGETS, TARGET, source=CLEAN_SOURCES, corrupt_source=CORRUPT_SOURCES[:2])
    longer = ["w3 w9 w14 w2 w40 w41", *CORRUPT_SOURCES[1:]]
    with pytest.raises(ResidError, match="Pair 0: the clean source has 5 tokens and the corrupt one 6"):
        patching.activation(model, TARGETS, TARGETS, TARGET, sites=["encoder.layers[0].mlp"], source=CLEAN_SOURCES,
                            corrupt_source=longer)
    # decoder sites read each prompt's own source, whatever its length
    df = patching.activation(model, TARGETS, TARGETS, TARGET, sites=["layers[0].cross"], source=CLEAN_SOURCES,
                             corrupt_source=longer)
    assert len(df) == 3
    with pytest.raises(ResidError, match="method='atp'|method=\"atp\""):
        patching.atp(model, TARGETS, TARGETS, TARGET, method="atp*", source=CLEAN_SOURCES)
    with pytest.raises(ResidError, match="sites of sublayer, head"):
        patching.atp(model, TARGETS, TARGETS, TARGET, sites="resid_pre", source=CLEAN_SOURCES)
    with pytest.raises(ResidError, match="in process for now"):
        patching.atp(model, TARGETS, TARGETS, TARGET, sites="head", source=CLEAN_SOURCES,
                     execution=Execution(executor="ray", workers=2))
    with pytest.raises(ResidError, match="in process for now"):
        patching.activation(model, TARGETS, TARGETS, TARGET, source=CLEAN_SOURCES,
                            execution=Execution(executor="ray", workers=2))
    with pytest.raises(ResidError, match="Path patching does not take encoder-decoder models"):
        patching.path(model, TARGETS, TARGETS, TARGET, senders=[[Site(0, "attn")]], receivers=[Site(1, "attn")])
