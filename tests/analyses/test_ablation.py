"""Every number an ablation sweep reports equals a brute-force recomputation: one full forward of the
prompt alone with that single ablation, no prefix reuse, no batching."""

import pandas as pd
import pytest
import torch
from swap_prompts import BASELINES, DONORS, PROMPTS, TARGETS
from tiny_fixtures import Tiny
from tiny_models import VARIANTS

import resid
from resid import Replace, Site, ZeroAblate
from resid.analyses import Execution, ablation
from resid.analyses.metrics import metric_values
from resid.analyses.sweeps.rows import edited

REFERENCE = ["Reference text one is here, and it is long enough to cover every position.", "More words."]
TOL = dict(atol=1e-5, rtol=1e-5)
CAPTURE_UNITS = resid.Capture(attn={"out", "z"}, mlp={"out", "post"})


def _unit(stream, site: Site) -> torch.Tensor:
    """The site's value, read by hand (not through stream.read, which the sweep uses)."""
    record = getattr(stream.layers[site.layer], site.part)
    if site.head is not None:
        return record.z[:, :, site.head]
    if site.neuron is not None:
        return record.post[:, :, site.neuron]
    return record.out


_CACHE: dict = {}


def _cached(key, compute):
    """The brute force recomputes the same means and donor runs for many rows: compute each once."""
    if key not in _CACHE:
        _CACHE[key] = compute()
    return _CACHE[key]


def _reference_mean(model, site: Site) -> torch.Tensor:
    """Plain mean over every real token of every reference text, each text run alone and cut, like the
    sweep's, to the longest prompt's token count."""
    longest = max(len(model.tokenizer.encode(p)) for p in PROMPTS)
    values = [
        _unit(model.run(torch.tensor(model.tokenizer.encode(text)[:longest]), capture=CAPTURE_UNITS).stream, site)[0]
        for text in REFERENCE
    ]
    return torch.cat(values).double().mean(0).to(model.dtype)


def brute_force(model, prompt_idx: int, sites: tuple[Site, ...], method: str, metric: str = "logit_diff") -> float:
    if method == "zero":
        edits = [ZeroAblate(s) for s in sites]
    elif method == "mean":
        edits = [Replace(s, _cached(("mean", id(model), s), lambda s=s: _reference_mean(model, s))) for s in sites]
    else:
        donor = _cached(("donor", id(model), prompt_idx),
                        lambda: model.run(DONORS[prompt_idx], capture=CAPTURE_UNITS).stream)
        edits = [Replace(s, _unit(donor, s)) for s in sites]
    logits = model.run(PROMPTS[prompt_idx], interventions=edits, logits_at="last").logits[:, 0]
    target, baseline = (torch.tensor(model.tokenizer.encode(t[prompt_idx], prepend_bos=False))
                        for t in (TARGETS, BASELINES))
    return metric_values(metric, logits, target, baseline).item()


def check_rows(model, df: pd.DataFrame, method: str, metric: str = "logit_diff") -> None:
    """Every row's site, read back from its label: a layer is its two writes, replaced together."""
    for row in df.itertuples():
        site = Site.parse(row.site)
        expected = brute_force(model, row.prompt_idx, tuple(edited(site, model.config)), method, metric)
        torch.testing.assert_close(row.ablated_metric, expected, **TOL)
        torch.testing.assert_close(row.delta, row.ablated_metric - row.clean_metric, **TOL)


def run_sweep(model, method: str, n: int = 4, **options) -> pd.DataFrame:
    """Sweep the first n prompts (n even keeps every donor pair together)."""
    reference = {"zero": None, "mean": REFERENCE, "resample": DONORS[:n]}[method]
    return ablation.sweep(model, PROMPTS[:n], TARGETS[:n], BASELINES[:n], method=method, reference=reference, **options)


METHODS = ("zero", "mean", "resample")
KINDS = ("layer", "sublayer", "head")
EVERY_METHOD = ("gpt2", "llama")  # LayerNorm with biases, RMSNorm without: the full method x kind grid


@pytest.mark.parametrize("kind", KINDS)
def test_sweep_equals_brute_force_on_every_family(tiny: Tiny, kind: str):
    """Every family and kind; the method rotates with the family (so each kind meets each method on six
    families or more), and the EVERY_METHOD families run all three: the grid in a third of the forwards."""
    model = tiny.model
    for prompt, donor in zip(PROMPTS, DONORS):
        assert len(model.tokenizer.encode(prompt)) == len(model.tokenizer.encode(donor))
    rotated = METHODS[(VARIANTS.index(tiny.variant) + KINDS.index(kind)) % len(METHODS)]
    for method in METHODS if tiny.variant in EVERY_METHOD else (rotated,):
        n = 2 if kind == "head" else 4  # heads give many rows per prompt: two prompts keep the brute force quick
        df = run_sweep(model, method, n, sites=kind, execution=Execution(batch_size=5))
        cfg = model.config
        per_prompt = {"layer": cfg.n_layers, "sublayer": 2 * cfg.n_layers, "head": cfg.n_layers * cfg.n_heads}[kind]
        assert len(df) == n * per_prompt and not df.duplicated(["prompt_idx", "site"]).any()
        assert list(df.prompt_idx) == sorted(df.prompt_idx)
        check_rows(model, df, method)


def test_the_rotation_covers_every_method_and_kind():
    for kind in KINDS:
        met = {METHODS[(VARIANTS.index(v) + KINDS.index(kind)) % len(METHODS)] for v in VARIANTS}
        assert met == set(METHODS)


@pytest.mark.parametrize("method", ["zero", "mean", "resample"])
def test_sweep_on_smollm2(smollm2, method: str):
    sites = [Site(0, "attn"), Site(14, "mlp"), Site(29, "attn", head=3), Site(9, "mlp", neuron=100), Site(-1, "mlp")]
    df = run_sweep(smollm2, method, sites=sites, execution=Execution(batch_size=3))
    assert len(df) == len(PROMPTS) * len(sites)
    assert set(df.site) == {"layers[0].attn", "layers[14].mlp", "layers[29].attn.head[3]",
                            "layers[9].mlp.neuron[100]", "layers[29].mlp"}
    check_rows(smollm2, df, method)


def test_metrics_and_clean_values(tiny: Tiny):
    model = tiny.model
    for metric in ("target_prob", "loss", "logit"):
        df = ablation.sweep(model, PROMPTS[:2], TARGETS[:2], sites="layer", metric=metric)
        check_rows(model, df, "zero", metric=metric)
    clean = model.run(PROMPTS[0], logits_at="last").logits[0, 0].softmax(-1)
    df = ablation.sweep(model, PROMPTS[:1], TARGETS[0], sites="layer")  # default: target_prob
    assert (df.metric == "target_prob").all()
    mary = model.tokenizer.encode(" Mary", prepend_bos=False)[0]
    torch.testing.assert_close(df.clean_metric.iloc[0], clean[mary].item(), **TOL)


def test_batch_size_invariance(tiny: Tiny):
    one = run_sweep(tiny.model, "resample", sites="sublayer", execution=Execution(batch_size=1))
    auto = run_sweep(tiny.model, "resample", sites="sublayer")
    pd.testing.assert_frame_equal(one, auto, atol=1e-5, rtol=1e-5)


def test_per_position_means_equal_brute_force(tiny: Tiny):
    model = tiny.model
    longest = max(len(model.tokenizer.encode(p)) for p in PROMPTS[:2])
    reference = [" ".join(["word"] * (longest + 3)), "Short text.", " ".join(["other words"] * longest)]
    df = ablation.sweep(model, PROMPTS[:2], TARGETS[:2], BASELINES[:2], sites="sublayer", method="mean",
                        reference=reference, mean_positions="per_position", execution=Execution(batch_size=3))
    for row in df.itertuples():
        site = Site(row.layer, row.part)
        per_text = [_unit(model.run(torch.tensor(model.tokenizer.encode(t)[:longest]), capture=CAPTURE_UNITS).stream,
                          site)[0] for t in reference]
        means = torch.stack([
            torch.stack([v[p] for v in per_text if v.shape[0] > p]).double().mean(0) for p in range(longest)
        ]).float()
        n_tokens = len(model.tokenizer.encode(PROMPTS[row.prompt_idx]))
        logits = model.run(PROMPTS[row.prompt_idx], interventions=[Replace(site, means[:n_tokens])],
                           logits_at="last").logits[:, 0]
        ids = [torch.tensor(model.tokenizer.encode(t[row.prompt_idx], prepend_bos=False)) for t in (TARGETS, BASELINES)]
        torch.testing.assert_close(row.ablated_metric, metric_values("logit_diff", logits, *ids).item(), **TOL)
    with pytest.raises(resid.ResidError, match="no reference text reaches position"):
        ablation.sweep(model, PROMPTS[:2], TARGETS[:2], BASELINES[:2], method="mean", reference=["Short."],
                       mean_positions="per_position")


def test_random_donors_have_equal_length_and_follow_the_seed():
    from resid.analyses.sweeps.values import random_donors

    lengths = [5, 5, 7, 7, 7]
    donors = random_donors(lengths, seed=3)
    assert donors[:2] == [1, 0]
    assert all(lengths[d] == lengths[i] and d != i for i, d in enumerate(donors))
    assert random_donors(lengths, seed=3) == donors
    assert len({tuple(random_donors(lengths, seed=s)) for s in range(20)}) > 1
    with pytest.raises(resid.ResidError, match="another prompt with the same number of tokens"):
        random_donors([5, 6], seed=0)
