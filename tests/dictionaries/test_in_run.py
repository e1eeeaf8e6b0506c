"""Dictionaries in a run, on every tiny family: observing changes no logit (bit for bit); splicing with the error
term equals the clean run to float32 rounding; splicing the reconstruction alone equals replacing the site by it;
feature writes + decoder bias + skip + error sum to the tensor reconstructed."""

import pytest
import torch
from numerics import EXACT, TINY
from random_dictionaries import random_dictionary, standard_set
from random_models import make_random_model
from tiny_fixtures import random_ids

import resid
from resid.dictionaries import Observe, Splice
from resid.dictionaries.hooks import read
from resid.errors import ResidError


@pytest.fixture(scope="module")
def runs(tiny):
    """(model, ids, dictionaries, plain run with everything captured, observed run)."""
    model, ids = tiny.model, random_ids(1)
    dictionaries = standard_set(model)
    return model, ids, dictionaries, model.run(ids, capture=resid.Capture.all()), model.run(ids,
                                                                                           dictionaries=dictionaries)


def test_observing_changes_no_logit_and_the_records_add_up(runs) -> None:
    model, ids, dictionaries, plain, observed = runs
    assert torch.equal(observed.logits, plain.logits)
    assert set(observed.dictionaries) == {d.name for d in dictionaries}
    fired = 0
    for d in dictionaries:
        record = observed.dictionaries[d.name]
        x, target = read(plain, model, d.point_in), read(plain, model, d.point_out)
        assert record.acts.shape == (*ids.shape, d.d_sae) and record.mode == "observe"
        torch.testing.assert_close(record.input, x, **EXACT)
        torch.testing.assert_close(record.reconstruction + record.error, target, **EXACT)
        writes = record.acts @ d.W_dec + d.b_dec + (x @ d.W_skip if d.W_skip is not None else 0)
        torch.testing.assert_close(writes + record.error, target, **TINY)
        torch.testing.assert_close(record.acts, d.encode(x), **EXACT)
        fired += int((record.acts > 0).sum())
    assert fired > 0


def test_splicing_with_the_error_equals_the_clean_run(runs) -> None:
    model, ids, dictionaries, plain, observed = runs
    spliced = model.run(ids, dictionaries=[Splice(d) for d in dictionaries])
    torch.testing.assert_close(spliced.logits, plain.logits, **TINY)
    for d in dictionaries:
        record, seen = spliced.dictionaries[d.name], observed.dictionaries[d.name]
        assert record.mode == "splice"
        torch.testing.assert_close(record.acts, seen.acts, **TINY)
        torch.testing.assert_close(record.input, seen.input, **TINY)
        torch.testing.assert_close(record.reconstruction + record.error, seen.reconstruction + seen.error, **TINY)


@pytest.mark.parametrize("which", [0, 3, 5])  # the residual SAE, the z SAE, the transcoder
def test_splicing_the_reconstruction_alone_replaces_the_site_by_it(runs, which) -> None:
    model, ids, dictionaries, plain, observed = runs
    d = dictionaries[which]
    spliced = model.run(ids, dictionaries=[Splice(d, error=False)])
    recon = observed.dictionaries[d.name].reconstruction
    site = d.point_out.site
    value = recon.view(*recon.shape[:2], model.config.n_heads, -1) if d.point_out.heads_flat else recon
    replaced = model.run(ids, interventions=[resid.Replace(site, value)])
    torch.testing.assert_close(spliced.logits, replaced.logits, **TINY)
    assert spliced.dictionaries[d.name].mode == "reconstruction"
    assert not torch.allclose(spliced.logits, plain.logits, **TINY)  # the dictionary loses something


def test_storage_is_sparse_when_mostly_zero_and_dense_on_request(runs) -> None:
    model, ids, dictionaries, plain, observed = runs
    d = dictionaries[2]  # top-5 of 40 features: always mostly zero
    sparse = observed.dictionaries[d.name]
    dense = model.run(ids, dictionaries=[Observe(d, storage="dense")]).dictionaries[d.name]
    assert sparse.stored.is_sparse and not dense.stored.is_sparse
    assert torch.equal(sparse.acts, dense.acts)
    index, values = sparse.active()
    assert index.shape == (int(dense.acts.count_nonzero()), 3) and index.shape[0] <= ids.numel() * 5
    assert torch.equal(dense.acts[tuple(index.T)], values)
    assert observed.dictionaries[d.point_in.site] is observed.dictionaries[d.name]  # found by its site too


def test_what_a_run_cannot_take_is_refused_clearly() -> None:
    model = make_random_model("llama_gqa")
    d = random_dictionary(model, "blocks.0.hook_resid_post", name="sae")
    with pytest.raises(resid.ResidError, match="Two dictionaries of one run are named 'sae'"):
        model.run(torch.tensor([[1, 2, 3]]), dictionaries=[d, Splice(d)])
    run = model.run(torch.tensor([[1, 2, 3]]), dictionaries=[d])
    with pytest.raises(resid.ResidError, match="No dictionary of this run is named or reads 'layers\\[1\\].mlp'"):
        run.dictionaries["layers[1].mlp"]


def test_the_sublayer_input_can_be_edited() -> None:
    """Splicing a transcoder's input edits the sublayer's `normalized` input: a Replace there is what the MLP
    reads."""
    model = make_random_model("llama_gqa")
    ids = torch.tensor([[1, 2, 3, 4]])
    clean = model.run(ids, capture=resid.Capture.all())
    site = resid.Site(1, "mlp", field="normalized")
    edited = model.run(ids, capture=resid.Capture.all(), interventions=[resid.ZeroAblate(site)])
    assert torch.equal(edited.read(site), torch.zeros_like(clean.read(site)))
    mlp = model.blocks[1].mlp
    torch.testing.assert_close(edited.stream.layers[1].mlp.out, mlp(torch.zeros_like(clean.read(site)),
                                                                    frozenset(), ())[0], **EXACT)


def test_a_dictionary_on_another_device_than_the_model_is_refused_with_what_to_do() -> None:
    model = make_random_model("llama_gqa")
    sae = random_dictionary(model, "blocks.0.hook_resid_post", seed=1, name="r0").to("meta")
    with pytest.raises(resid.ResidError, match=r"'r0' is on meta and the model on cpu: move it there first"):
        model.run(torch.tensor([[1, 2, 3]]), dictionaries=[sae])


def test_a_splice_of_a_standardized_input_whose_norm_gain_has_a_zero_is_refused() -> None:
    """(normalized - b) / g cannot recover what a zero gain entry zeroed; observing still works."""
    model = make_random_model("llama_gqa")
    ids = torch.randint(0, model.config.d_vocab, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.blocks[1].ln_mlp.w[3] = 0.0
    fine = random_dictionary(model, "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out", seed=1, name="t0")
    zeroed = random_dictionary(model, "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out", seed=2, name="t1")
    with pytest.raises(ResidError, match=r"'t1' reads the standardized input of layers\[1\]\.mlp.*zero entry"):
        model.run(ids, dictionaries=[Splice(fine), Splice(zeroed)])
    assert set(model.run(ids, dictionaries=[Splice(fine), zeroed]).dictionaries) == {"t0", "t1"}
