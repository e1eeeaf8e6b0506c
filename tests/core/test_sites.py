"""resid.Site: one address for every place of a run. Labels parse back to the same Site, reading a site gives the
tensor the stream's typed fields hold, edits of residual sites keep the stream's sums exact, and bad sites are one
clear error."""

import numpy as np
import pytest
import torch
from bad_option import BAD_OPTION
from hypothesis import given, settings
from hypothesis import strategies as st
from numerics import TINY

import resid
import resid.hook_names as hook_names
from resid import Capture, Replace, Site, ZeroAblate
from resid.errors import ResidError

TEXTS = ["The quick brown fox jumps over", "Hello there"]


def _sites() -> st.SearchStrategy[Site]:
    index = st.integers(-40, 40)
    positions = st.none() | st.lists(st.integers(-20, 20), min_size=1, max_size=3)
    layer_parts = st.sampled_from(["resid_pre", "resid_mid", "resid_post", "layer", "attn", "mlp", "cross"])
    whole = st.builds(Site, index, layer_parts, positions=positions)
    heads = st.builds(lambda l, h, f, p: Site(l, "attn", head=h, field=f, positions=p), index, index,
                      st.sampled_from([None, "z", "q", "pattern"]), positions)
    kv = st.builds(lambda l, h, f: Site(l, "attn", kv_head=h, field=f), index, index, st.sampled_from(["k", "v"]))
    neurons = st.builds(lambda l, i, f: Site(l, "mlp", neuron=i, field=f), index, index,
                        st.sampled_from([None, "post", "pre", "gate"]))
    experts = st.builds(lambda l, e, i: Site(l, "mlp", expert=e, neuron=i), index, index, st.none() | index)
    fields = st.builds(lambda l, p, f: Site(l, p, field=f), index, st.sampled_from(["attn", "mlp"]),
                       st.sampled_from(["normalized", "norm_scale", "out"]))
    terms = st.sampled_from([Site(None, "embed"), Site(None, "final_bias"), Site(2, "attn", field="b_O")])
    dictionary_parts = st.sampled_from(["resid_pre", "resid_mid", "resid_post", "attn", "mlp"])
    features = st.builds(lambda l, p, f, at: Site(l, p, feature=f, positions=at), index, dictionary_parts,
                         st.integers(0, 20000), positions)
    dictionary_terms = st.builds(lambda l, p, f: Site(l, p, field=f), index, dictionary_parts,
                                 st.sampled_from(["reconstruction", "error", "skip", "b_dec"]))
    return whole | heads | kv | neurons | experts | fields | terms | features | dictionary_terms


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")  # beartype samples with random
@settings(max_examples=200, deadline=None)
@given(_sites())
def test_every_label_parses_back_to_its_site(site: Site):
    assert Site.parse(site.label) == site
    assert Site.parse(site.label).label == site.label


def test_labels_are_the_table_names():
    assert Site(3, "attn", head=5).label == "layers[3].attn.head[5]"
    assert Site(3, "attn", head=5, field="z") == Site(3, "attn", head=5)  # defaults are one value
    assert Site(3, "mlp", field="out") == Site(3, "mlp")
    assert Site(3, "resid_pre", positions=[-1]).label == "layers[3].resid_pre@-1"
    assert Site(2, "attn", kv_head=1, field="k").label == "layers[2].attn.kv_head[1].k"
    assert Site(1, "mlp", expert=2, neuron=7).label == "layers[1].mlp.expert[2].neuron[7]"
    assert Site(None, "embed").label == "embed" and Site(4, "layer").label == "layers[4]"
    assert Site(np.int64(3), "mlp", neuron=np.int32(4)).label == "layers[3].mlp.neuron[4]"  # numpy ints pass
    assert Site(3, "resid_post", feature=12).label == "layers[3].resid_post.feature[12]"  # a dictionary's feature
    assert Site(3, "resid_post", feature=12, field="acts") == Site(3, "resid_post", feature=12)
    assert Site(1, "mlp", field="error").label == "layers[1].mlp.error"
    assert Site(1, "mlp", field="b_dec").is_term and not Site(1, "mlp", feature=3).is_term
    assert Site(1, "mlp", feature=3).of_dictionary and not Site(1, "mlp", neuron=3).of_dictionary


@pytest.mark.parametrize("make, name", [
    (lambda: Site(3, "attn", head=True), "head"),
    (lambda: Site(3.0, "mlp"), "layer"),
    (lambda: Site(3, "mlp", positions=[1.5]), "positions"),
])
def test_indices_are_integers(make, name):
    """Floats and bools are refused (by resid, or first by the type checker when it is on), naming the field."""
    with pytest.raises(BAD_OPTION, match=name):
        make()


@pytest.mark.parametrize("make, message", [
    (lambda: Site(3, "mlp", head=1), "cannot take head"),
    (lambda: Site(3, "attn", kv_head=1), "needs field='k', 'v' or 'k_proj'"),
    (lambda: Site(3, "attn", head=1, field="k"), "has no head axis"),
    (lambda: Site(3, "ffn"), "Site part must be one of"),
    (lambda: Site(None, "attn"), "needs a layer"),
    (lambda: Site(3, "embed"), "belongs to no layer"),
    (lambda: Site.parse("layers[3].attn head 2"), "is not a site label"),
    (lambda: Site(3, "resid_pre", positions=[]), "positions is empty"),
    (lambda: Site(3, "mlp", neuron=2, feature=1), "a unit of its own"),
    (lambda: Site(3, "resid_post", feature=-1), "feature index >= 0"),
    (lambda: Site(3, "resid_post", field="z"), "takes no field"),
    (lambda: Site(None, "embed", feature=1), "takes no feature"),
])
def test_bad_sites_are_one_clear_error(make, message):
    with pytest.raises(ResidError, match=message):
        make()


def test_indices_count_from_the_end_like_layers(random_model):
    cfg = random_model.config
    site = Site(-1, "attn", head=-1).resolve(cfg)
    assert (site.layer, site.head) == (cfg.n_layers - 1, cfg.n_heads - 1)
    assert Site(-1, "mlp", neuron=-1).resolve(cfg).neuron == cfg.d_mlp - 1
    with pytest.raises(ResidError, match=f"head {cfg.n_heads} is out of range"):
        Site(0, "attn", head=cfg.n_heads).resolve(cfg)
    with pytest.raises(ResidError, match="layer 99 is out of range"):
        random_model.run(TEXTS, interventions=[ZeroAblate(Site(99, "mlp"))])


def test_reading_a_site_is_the_typed_field(random_model):
    run = random_model.run(TEXTS, capture=Capture.all())
    layer = run.stream.layers[1]
    torch.testing.assert_close(run.read(Site(1, "attn", head=2)), layer.attn.z[:, :, 2])
    torch.testing.assert_close(run.read(Site(1, "attn", kv_head=0, field="v")), layer.attn.v[:, :, 0])
    torch.testing.assert_close(run.read(Site(1, "attn", head=1, field="pattern")), layer.attn.pattern[:, 1])
    torch.testing.assert_close(run.read(Site(1, "mlp", neuron=3)), layer.mlp.post[:, :, 3])
    torch.testing.assert_close(run.read(Site(2, "resid_pre")), run.stream.resid_pre(2))
    at = run.read(Site(2, "resid_post", positions=[0, -1]))
    index = run.tokens.padded_index([0, -1])
    torch.testing.assert_close(at, run.stream.resid_post(2)[torch.arange(2)[:, None], index])
    with pytest.raises(ResidError, match="term of an attribution"):
        run.read(Site(None, "final_bias"))


def test_capture_of_sites_records_what_they_read(random_model):
    sites = [Site(1, "attn", head=0), Site(0, "mlp", neuron=2), Site(2, "attn", kv_head=0, field="k")]
    run = random_model.run(TEXTS, capture=Capture.of(sites))
    for site in sites:
        assert run.read(site).shape[:2] == run.tokens.ids.shape
    with pytest.raises(ResidError, match="was not captured"):
        run.read(Site(1, "attn", head=0, field="q"))


@pytest.mark.parametrize("part", ["resid_pre", "resid_mid", "resid_post"])
def test_editing_a_residual_site_keeps_the_stream_exact(random_model, part):
    """Replacing the residual at a site changes the run downstream, and the stream records what the edit added,
    so its components still sum to the final residual and the site reads the replaced value."""
    if part == "resid_mid" and random_model.config.block == "parallel":
        pytest.skip("parallel blocks have no resid_mid")
    site = Site(1, part, positions=[-1])
    clean = random_model.run(TEXTS)
    value = torch.randn(2, 1, random_model.config.d_model)
    run = random_model.run(TEXTS, interventions=[Replace(site, value)])
    torch.testing.assert_close(run.read(site), value, **TINY)
    sites, writes = run.stream.components()
    assert site.whole in sites
    torch.testing.assert_close(writes.sum(0), run.stream.final(), **TINY)
    assert not torch.allclose(run.logits[:, -1], clean.logits[:, -1])
    torch.testing.assert_close(run.logits[:, :-1], clean.logits[:, :-1], **TINY)  # earlier positions: causal


def test_a_whole_layer_is_its_writes(random_model):
    both = random_model.run(TEXTS, interventions=[ZeroAblate(Site(1, "attn")), ZeroAblate(Site(1, "mlp"))]).logits
    layer = random_model.run(TEXTS, interventions=[ZeroAblate(Site(1, "layer"))]).logits
    torch.testing.assert_close(layer, both)
    with pytest.raises(ResidError, match="only ZeroAblate and Scale"):
        random_model.run(TEXTS, interventions=[Replace(Site(1, "layer"), torch.zeros(1))])


def test_transformer_lens_names(random_model):
    assert Site.from_hook_name("blocks.3.hook_resid_pre") == Site(3, "resid_pre")
    assert Site.parse("blocks.2.attn.hook_z") == Site(2, "attn", field="z")
    assert Site.from_hook_name("blocks.2.attn.hook_z", 5) == Site(2, "attn", head=5)
    assert Site.from_hook_name("blocks.2.attn.hook_rot_k", 1) == Site(2, "attn", kv_head=1, field="k")
    assert Site(4, "mlp", neuron=3).hook_name == "blocks.4.mlp.hook_post"
    run = random_model.run(TEXTS, capture=Capture.all())
    names = hook_names.view(run, random_model)
    for site in [Site(1, "resid_post"), Site(0, "mlp"), Site(2, "attn", field="z")]:
        torch.testing.assert_close(names[site.hook_name], run.read(site))


def test_non_finite_values_name_the_first_site_in_every_dtype(random_model):
    """An intervention that puts a NaN in a float32 run is an error naming that site (float16 runs already
    refused overflow); check_finite=False gives the values as they are."""
    bad = [resid.Add(Site(1, "mlp", positions=[0]), torch.tensor(float("nan")))]
    with pytest.raises(ResidError, match=r"first non-finite site is layers\[1\]\.mlp"):
        random_model.run(TEXTS, interventions=bad)
    with pytest.raises(ResidError, match=r"first non-finite site is layers\[1\]\.mlp"):
        random_model.generate("Hello there", 2, interventions=bad)
    assert random_model.run(TEXTS, interventions=bad, check_finite=False).logits.isnan().any()
