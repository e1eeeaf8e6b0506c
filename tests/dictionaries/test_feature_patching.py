"""Patching the features of learned dictionaries (resid.analyses.patching.features): exact patching through the
engine equals one forward per feature with a hook written here, sites="feature" names exactly the features active
in some prompt, AtP's estimate is the gradient at the dictionary's site times the change of the feature's write,
and the two tables join in compare."""

import pytest
import torch
from numerics import TINY
from random_dictionaries import random_dictionary

import resid
from resid.analyses import patching
from resid.errors import ResidError

NAMES = [(" Mary", " John"), (" Alice", " Bob")]
CLEAN = [f"When{a} and{b} went to the store,{b} gave a drink to" for a, b in NAMES]
CORRUPT = [f"When{a} and{b} went to the store,{a} gave a drink to" for a, b in NAMES]
TARGETS, BASELINES = [a for a, _ in NAMES], [b for _, b in NAMES]
# The patching code is the same on every family (test_in_run covers the splices on all): a pre-norm, a sandwich-norm
# and a parallel-block family keep this fast
FAMILIES = ("llama_gqa", "gemma3_like", "neox_parallel")


@pytest.fixture
def setup(random_model):
    model = random_model
    if model.name.removeprefix("random-") not in FAMILIES:
        pytest.skip("feature patching is checked on a few unlike families")
    dictionaries = [random_dictionary(model, "blocks.0.hook_resid_post", d_sae=16, seed=3, name="r0"),
                    random_dictionary(model, "blocks.1.hook_mlp_out", d_sae=16, seed=4, name="m1")]
    clean = model.run(CLEAN, capture=resid.Capture.all())
    corrupt = model.run(CORRUPT, capture=resid.Capture.all())
    ids = [(model.to_single_token(a), model.to_single_token(b)) for a, b in NAMES]
    return model, dictionaries, clean, corrupt, ids


def _acts(d, x: torch.Tensor) -> torch.Tensor:
    """The ReLU activations [batch pos feature], by hand."""
    return torch.relu(x @ d.W_enc + d.b_enc)


def _diff(logits: torch.Tensor, ids) -> torch.Tensor:
    return torch.stack([logits[i, a] - logits[i, b] for i, (a, b) in enumerate(ids)])


def test_feature_patching_equals_one_forward_per_feature(setup) -> None:
    model, dictionaries, clean, corrupt, ids = setup
    table = patching.activation(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="feature", dictionaries=dictionaries)
    mask = model.to_tokens(CLEAN).attention_mask.bool()
    for d in dictionaries:
        site = d.point_out.site
        a_clean, a_corrupt = _acts(d, clean.read(site)), _acts(d, corrupt.read(site))
        active = ((a_clean[mask] != 0) | (a_corrupt[mask] != 0)).any(0).nonzero().flatten().tolist()
        mine = table[table["site"].str.startswith(site.label + ".feature[")]
        assert sorted({resid.Site.parse(s).feature for s in mine["site"]}) == active
        assert len(mine) == 2 * len(active)  # every pair, every active feature
        # the features that move the metric most, and one that barely does, by hand: the donor's activation in
        for label in [*mine.loc[mine["score"].abs().nlargest(2).index, "site"], mine["site"].iloc[0]]:
            f = resid.Site.parse(label).feature

            def hook(x, tokens, f=f, d=d, donor=a_clean[..., f]):
                return x + ((donor - _acts(d, x)[..., f])[..., None] * d.W_dec[f]).to(x.dtype)

            logits = model.run(CORRUPT, interventions=[resid.Hook(site, hook)], logits_at="last").logits[:, 0]
            got = torch.tensor(mine[mine["site"] == label].sort_values("prompt_idx")["patched_metric"].to_numpy())
            torch.testing.assert_close(got.float(), _diff(logits, ids), **TINY)


def test_feature_atp_is_the_gradient_at_the_site_times_the_change_of_the_write(setup) -> None:
    model, dictionaries, clean, corrupt, ids = setup
    table = patching.atp(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="feature", dictionaries=dictionaries)
    base = _diff(model.run(CORRUPT, logits_at="last").logits[:, 0], ids)
    mask = model.to_tokens(CLEAN).attention_mask[..., None].float()
    for d in dictionaries:
        site = d.point_out.site
        zero = torch.zeros_like(corrupt.read(site), requires_grad=True)
        run = model.run(CORRUPT, interventions=[resid.Hook(site, lambda x, tokens: x + zero)], logits_at="last",
                        grad=True)
        (grad,) = torch.autograd.grad(_diff(run.logits[:, 0], ids).sum(), [zero])
        delta = (_acts(d, clean.read(site)) - _acts(d, corrupt.read(site))) * mask  # [pair pos feature]
        expected = base[:, None] + (delta * (grad @ d.W_dec.T)).sum(1)  # [pair feature]
        mine = table[table["site"].str.startswith(site.label + ".feature[")]
        moved = (delta != 0).any(1)
        assert len(mine) == int(moved.sum())  # a row for each feature that differs between the pair's prompts
        for row in mine.itertuples():
            f = resid.Site.parse(row.site).feature
            assert bool(moved[row.prompt_idx, f])
            assert row.patched_metric == pytest.approx(float(expected[row.prompt_idx, f].detach()), rel=1e-4, abs=1e-4)
            assert row.magnitude == pytest.approx(abs(row.patched_metric - float(base[row.prompt_idx])), abs=1e-6)


def test_features_join_the_other_sites_and_compare_scores_them(setup) -> None:
    model, dictionaries, *_ = setup
    if model.name != "random-llama_gqa":
        pytest.skip("one family: the join does not depend on it")
    both = patching.atp(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=("head", "feature"),
                        dictionaries=dictionaries, method="atp*")
    heads = both[both["site"].str.contains(".head[", regex=False)]
    assert len(heads) == 2 * model.config.n_layers * model.config.n_heads
    estimate = both[both["site"].str.contains(".feature[", regex=False)]
    assert len(estimate) and list(both["site"].iloc[: len(heads) // 2]) == list(heads["site"].iloc[: len(heads) // 2])
    exact = patching.activation(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="feature", dictionaries=dictionaries)
    scored = patching.compare(estimate, exact, k=3)
    assert scored["sites"] == len(set(estimate["site"])) and -1 <= scored["spearman"] <= 1


def test_features_need_their_dictionaries(random_model) -> None:
    with pytest.raises(ResidError, match=r"dictionaries=\[sae"):
        patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="feature")
    with pytest.raises(ResidError, match=r"dictionaries=\[sae"):
        patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="feature")
    site = resid.Site(0, "resid_post", feature=1)
    with pytest.raises(ResidError, match=r"feature\[1\]\): pass them, dictionaries=\[sae"):
        patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=[site])
