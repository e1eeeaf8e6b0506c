"""Interventions on dictionary features: through model.run they equal a hand-written hook that adds what the edit
changes in the feature's write, and through the intervention-sweep engine (batched, resumed from the clean prefix) every
row equals one forward per (prompt, feature) with that hook, for zero, mean and resample ablation."""

import pytest
import torch
from numerics import TINY
from random_dictionaries import random_dictionary
from swap_prompts import BASELINES, DONORS, PROMPTS, TARGETS

import resid
from resid import Add, Hook, Scale, Site, ZeroAblate
from resid.analyses import Execution, ablation
from resid.analyses.metrics import metric_values

REFERENCE = ["Reference text one is here, and it is long enough to cover every position.", "More words."]
# The engine is the same code on every family (test_in_run covers them all): a few unlike ones keep this fast
FAMILIES = ("gpt2", "llama_gqa_tied", "gpt_neox_parallel", "gemma2", "mixtral")


def _act(d, x: torch.Tensor, f: int) -> torch.Tensor:
    """Feature f's ReLU activation, by hand."""
    return torch.relu(x @ d.W_enc[:, f] + d.b_enc[f])


def _by_hand(d, f: int, new) -> Hook:
    """The tensor d reconstructs, plus (new activation - activation) * W_dec[f]; `new` maps the activation."""
    def fn(x: torch.Tensor, tokens) -> torch.Tensor:
        a = _act(d, x, f)
        return x + ((new(a) - a)[..., None] * d.W_dec[f]).to(x.dtype)

    return Hook(d.point_out.site, fn)


@pytest.fixture(scope="module")
def setup(tiny):
    if tiny.variant not in FAMILIES:
        pytest.skip("the feature edits are checked on a few unlike families")
    model = tiny.model
    dictionaries = [random_dictionary(model, "blocks.0.hook_resid_post", seed=11, name="r0"),
                    random_dictionary(model, "blocks.1.hook_mlp_out", seed=12, name="m1")]
    run = model.run(PROMPTS[:4], dictionaries=dictionaries)
    features = {d.name: run.dictionaries[d.name].acts.sum((0, 1)).topk(2).indices.tolist() for d in dictionaries}
    return model, dictionaries, features


def test_feature_interventions_in_a_run_equal_a_hand_written_hook(setup) -> None:
    model, dictionaries, features = setup
    d = dictionaries[0]
    f = features[d.name][0]
    site = Site(0, "resid_post", feature=f)
    for edit, new in ((ZeroAblate(site), torch.zeros_like), (Scale(site, 3.0), lambda a: 3 * a),
                      (Add(site, torch.tensor(2.5)), lambda a: a + 2.5)):
        got = model.run(PROMPTS[:2], dictionaries=[d], interventions=[edit]).logits
        expected = model.run(PROMPTS[:2], interventions=[_by_hand(d, f, new)]).logits
        torch.testing.assert_close(got, expected, **TINY)
    at_last = Site(0, "resid_post", feature=f, positions=[-1])
    got = model.run(PROMPTS[:2], dictionaries=[d], interventions=[ZeroAblate(at_last)]).logits
    last = model.tokenizer is not None and model.to_tokens(PROMPTS[:2]).padded_index([-1])
    expected = model.run(PROMPTS[:2], interventions=[_by_hand(d, f, lambda a: a.index_put(
        (torch.arange(2)[:, None], last), torch.zeros(2, 1)))]).logits
    torch.testing.assert_close(got, expected, **TINY)
    with pytest.raises(resid.ResidError, match="edited through the dictionary"):
        model.run(PROMPTS[:1], interventions=[ZeroAblate(site)])


_CACHE: dict = {}


def _brute_force(model, d, f: int, prompt: int, method: str) -> float:
    if method == "zero":
        new = torch.zeros_like
    elif method == "mean":
        new = _CACHE.get((id(model), d.name, f))
    if method == "mean" and new is None:
        longest = max(len(model.tokenizer.encode(p)) for p in PROMPTS[:2])
        values = [_act(d, model.run(torch.tensor(model.tokenizer.encode(t)[:longest]), capture=resid.Capture.all())
                       .read(d.point_out.site)[0], f) for t in REFERENCE]
        mean = torch.cat(values).double().mean().float()
        new = _CACHE[id(model), d.name, f] = lambda a: torch.full_like(a, float(mean))  # noqa: E731
    elif method == "resample":
        donor = _act(d, model.run(DONORS[prompt], capture=resid.Capture.all()).read(d.point_out.site), f)
        new = lambda a: donor.expand_as(a)  # noqa: E731
    logits = model.run(PROMPTS[prompt], interventions=[_by_hand(d, f, new)], logits_at="last").logits[:, 0]
    target, baseline = (torch.tensor(model.tokenizer.encode(t[prompt], prepend_bos=False))
                        for t in (TARGETS, BASELINES))
    return metric_values("logit_diff", logits, target, baseline).item()


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_feature_ablation_through_the_engine_equals_one_forward_per_feature(setup, method) -> None:
    model, dictionaries, features = setup
    if model.config.post_norms or model.config.n_experts:
        pytest.skip("the engine's feature rows are checked on three families (the splice is the same on all)")
    sites = [Site(d.point_out.site.layer, d.point_out.site.part, feature=features[d.name][0]) for d in dictionaries]
    reference = {"zero": None, "mean": REFERENCE, "resample": DONORS[:2]}[method]
    df = ablation.sweep(model, PROMPTS[:2], TARGETS[:2], BASELINES[:2], sites=sites, method=method,
                        reference=reference, dictionaries=dictionaries, execution=Execution(batch_size=3))
    assert len(df) == 2 * len(sites)
    by_name = {(d.point_out.site.layer, d.point_out.site.part): d for d in dictionaries}
    for row in df.itertuples():
        site = Site.parse(row.site)
        expected = _brute_force(model, by_name[site.layer, site.part], site.feature, row.prompt_idx, method)
        torch.testing.assert_close(row.ablated_metric, expected, **TINY)
    assert (df["delta"].abs() > 0).any()
