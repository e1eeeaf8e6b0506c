"""Activation patching and attribution patching (resid.analyses.patching): exactness, agreement with one forward per
site written independently here, AtP against finite differences, compare, and bad input."""

import io
import sys

import pytest
import torch
from numerics import TINY

import resid
from resid.analyses import Execution, patching
from resid.errors import ResidError

NAMES = [(" Mary", " John"), (" Alice", " Bob")]
CLEAN = [f"When{a} and{b} went to the store,{b} gave a drink to" for a, b in NAMES]
CORRUPT = [f"When{a} and{b} went to the store,{a} gave a drink to" for a, b in NAMES]
TARGETS, BASELINES = [a for a, _ in NAMES], [b for _, b in NAMES]
S2 = 9  # the one position where each pair differs (prompt-relative)


def _logit_diffs(model, logits) -> list[float]:
    """logit(answer) - logit(other name) of each pair, from last-token logits [pairs d_vocab]."""
    return [(logits[i, model.to_single_token(a)] - logits[i, model.to_single_token(b)]).item()
            for i, (a, b) in enumerate(NAMES)]


def _patch(model, sites, **options):
    return patching.activation(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=sites, **options)


def test_pairs_differ_at_one_position(random_model):
    clean, corrupt = random_model.to_tokens(CLEAN).ids, random_model.to_tokens(CORRUPT).ids
    assert (clean != corrupt).nonzero()[:, 1].unique().tolist() == [clean.shape[1] - (14 - S2)]


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_patching_the_one_differing_embedding_restores_the_other_run(random_model, direction):
    """resid_pre 0 differs only at S2, so patching it there gives exactly the donor run: score 1 denoising,
    0 noising; every other position changes nothing."""
    df = _patch(random_model, "resid_pre", direction=direction).set_index(["prompt_idx", "site"])
    for prompt in range(len(NAMES)):
        row = df.loc[(prompt, f"layers[0].resid_pre@{S2}")]
        assert row["score"] == pytest.approx(1.0 if direction == "denoise" else 0.0, abs=TINY["atol"])
        other = df.loc[(prompt, "layers[0].resid_pre@3")]
        base = other["corrupt_metric"] if direction == "denoise" else other["clean_metric"]
        assert other["patched_metric"] == pytest.approx(base, abs=TINY["atol"])


@pytest.mark.parametrize("sites", ["resid_pre", "head"])
def test_patching_a_run_with_itself_changes_nothing(random_model, sites):
    df = patching.activation(random_model, CLEAN, CLEAN, TARGETS, BASELINES, sites=sites)
    assert (df["patched_metric"] - df["clean_metric"]).abs().max() < 1e-5
    assert df["score"].isna().all()  # clean == corrupt: no span to normalize by


def test_head_patching_equals_one_forward_per_site(random_model):
    df = _patch(random_model, "head").set_index(["prompt_idx", "site"])
    clean_z = random_model.run(CLEAN, capture=resid.Capture(attn={"z"})).stream
    for layer, head in [(0, 1), (2, 3)]:
        z = clean_z.layers[layer].attn.z[..., head, :]
        site = resid.Site(layer, "attn", head=head)
        logits = random_model.run(CORRUPT, interventions=[resid.Replace(site, z)], logits_at="last").logits[:, 0]
        for i, expected in enumerate(_logit_diffs(random_model, logits)):
            got = df.loc[(i, f"layers[{layer}].attn.head[{head}]"), "patched_metric"]
            assert got == pytest.approx(expected, abs=1e-5)


def test_pairs_given_as_token_ids_patch_as_their_texts(random_model):
    """Prompts as [batch pos] ids (or resid.Tokens), as every analysis takes them: the texts' tables, with
    targets given as ids too."""
    clean, corrupt = random_model.to_tokens(CLEAN), random_model.to_tokens(CORRUPT)
    targets = [random_model.to_single_token(t) for t in TARGETS]
    baselines = [random_model.to_single_token(t) for t in BASELINES]
    for method in (patching.activation, patching.atp):
        by_text = method(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head")
        for given in ((clean.ids, corrupt.ids), (clean, corrupt)):
            by_ids = method(random_model, *given, targets, baselines, sites="head")
            assert by_ids["site"].tolist() == by_text["site"].tolist()
            for column in ("clean_metric", "corrupt_metric", "patched_metric"):
                assert (by_ids[column] - by_text[column]).abs().max() < 1e-5, (method.__name__, column)
    one = patching.activation(random_model, clean.ids[0], corrupt.ids[0], targets[0], baselines[0], sites="head")
    assert one["prompt_idx"].unique().tolist() == [0]  # a [pos] tensor is one prompt
    with pytest.raises(ResidError, match="one corrupt prompt per clean prompt: got 2 and 1"):
        patching.activation(random_model, clean.ids, corrupt.ids[:1], targets, baselines, sites="head")


def test_resid_patching_equals_one_forward_per_site(random_model):
    """resid_pre(l) at position p is set to the clean value by adding the difference to the write before it,
    layers[l-1].mlp.out, in an ordinary forward pass."""
    df = _patch(random_model, "resid_pre").set_index(["prompt_idx", "site"])
    clean, corrupt = random_model.run(CLEAN).stream, random_model.run(CORRUPT).stream
    for layer, position in [(1, S2), (2, S2), (2, 12)]:
        at = random_model.to_tokens(CLEAN).padded_index([position])[:, 0]
        rows = torch.arange(len(NAMES))
        delta = (clean.resid_pre(layer) - corrupt.resid_pre(layer))[rows, at][:, None]
        site = resid.Site(layer - 1, "mlp", positions=[position])
        logits = random_model.run(CORRUPT, interventions=[resid.Add(site, delta)], logits_at="last").logits[:, 0]
        for i, expected in enumerate(_logit_diffs(random_model, logits)):
            got = df.loc[(i, f"layers[{layer}].resid_pre@{position}"), "patched_metric"]
            assert got == pytest.approx(expected, abs=1e-4)


def test_atp_is_the_linear_limit_of_patching(random_model):
    """Patching z of one head a fraction alpha of the way to the clean value: exact / alpha tends to AtP's
    estimate as alpha shrinks (the error falls with alpha)."""
    estimate = patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=("head",))
    estimate = estimate.set_index(["prompt_idx", "site"])
    clean_z = random_model.run(CLEAN, capture=resid.Capture(attn={"z"})).stream
    corrupt_z = random_model.run(CORRUPT, capture=resid.Capture(attn={"z"})).stream
    layer, head = 1, 2
    delta = (clean_z.layers[layer].attn.z - corrupt_z.layers[layer].attn.z)[..., head, :]
    ids = [(random_model.to_single_token(a), random_model.to_single_token(b)) for a, b in NAMES]

    def metric(logits):
        return torch.stack([logits[i, a] - logits[i, b] for i, (a, b) in enumerate(ids)])

    base = metric(random_model.run(CORRUPT, logits_at="last").logits[:, 0])
    atp = torch.tensor([estimate.loc[(i, f"layers[{layer}].attn.head[{head}]"), "patched_metric"] for i in range(2)])
    errors = []
    for alpha in (0.3, 0.03, 0.003):
        site = resid.Site(layer, "attn", head=head)
        logits = random_model.run(CORRUPT, interventions=[resid.Add(site, alpha * delta)], logits_at="last").logits
        slope = (metric(logits[:, 0]) - base) / alpha
        errors.append((slope - (atp - base)).abs().max().item())
    # the error shrinks with alpha (linearly) until float32 noise, and ends small against the effect itself
    assert errors[1] <= max(errors[0] / 3, 1e-3) and errors[2] <= max(errors[1] / 3, 1e-3)
    assert min(errors) < 0.02 * (atp - base).abs().max().item() + 1e-3


def test_atp_covers_every_site_and_compare_scores_it(random_model):
    estimate = patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=["resid_pre", "sublayer", "head"])
    n_layers, n_heads = random_model.config.n_layers, random_model.config.n_heads
    per_pair = n_layers * (2 + n_heads + 14)
    assert len(estimate) == 2 * per_pair
    exact = _patch(random_model, "head")
    same = patching.compare(exact, exact, k=5)
    assert same["spearman"] == pytest.approx(1.0) and same["top_k_overlap"] == 1.0 and same["false_negatives"] == []
    scored = patching.compare(estimate, exact, k=5)
    assert scored["sites"] == n_layers * n_heads and -1 <= scored["spearman"] <= 1


def test_atp_on_smollm2_ioi_finds_the_exact_top_heads(smollm2):
    exact = patching.activation(smollm2, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head")
    estimate = patching.atp(smollm2, CLEAN, CORRUPT, TARGETS, BASELINES, sites=("head",))
    scored = patching.compare(estimate, exact, k=20)
    assert scored["top_k_overlap"] >= 0.75 and scored["spearman"] > 0.8


def test_bad_input(random_model):
    with pytest.raises(ResidError, match="Pair 0: the clean prompt has 14 tokens and the corrupt one 15"):
        patching.activation(random_model, CLEAN[:1], [CORRUPT[0] + " the"], TARGETS[:1], BASELINES[:1])
    with pytest.raises(ResidError, match="one corrupt prompt per clean prompt"):
        patching.activation(random_model, CLEAN, CORRUPT[:1], TARGETS, BASELINES)
    with pytest.raises(ResidError, match="out of range"):
        _patch(random_model, [resid.Site(9, "attn")])
    with pytest.raises(ResidError, match="needs baselines"):
        patching.activation(random_model, CLEAN, CORRUPT, TARGETS, metric="logit_diff")


def test_head_inputs_are_patched_like_one_forward_per_site(random_model):
    """q / k / v of a head (Site(..., field=...)) through the engine equal one Replace of the clean value each."""
    sites = [resid.Site(1, "attn", head=2, field="q"), resid.Site(1, "attn", kv_head=0, field="k"),
             resid.Site(2, "attn", kv_head=1, field="v")]
    df = _patch(random_model, sites).set_index(["prompt_idx", "site"])
    clean = random_model.run(CLEAN, capture=resid.Capture(attn={"q", "k", "v"})).stream
    for site in sites:
        value = getattr(clean.layers[site.layer].attn, site.field)[..., site.unit, :]
        logits = random_model.run(CORRUPT, interventions=[resid.Replace(site, value)], logits_at="last").logits[:, 0]
        for i, expected in enumerate(_logit_diffs(random_model, logits)):
            assert df.loc[(i, site.label), "patched_metric"] == pytest.approx(expected, abs=1e-5)


def test_a_metric_function_of_the_logits(random_model):
    def margin(logits, targets, baselines):
        rows = torch.arange(len(targets))
        return logits[rows, targets] - logits[rows, baselines]

    custom = _patch(random_model, "head", metric=margin)
    named = _patch(random_model, "head", metric="logit_diff")
    assert (custom["metric"] == "margin").all()
    assert custom["patched_metric"].to_numpy() == pytest.approx(named["patched_metric"].to_numpy(), abs=1e-6)
    with pytest.raises(ResidError, match="must return one number per prompt"):
        _patch(random_model, "resid_pre", metric=lambda logits, t, b: logits.sum())


def test_smollm2_engine_equals_one_forward_per_site(smollm2):
    sites = [resid.Site(20, "attn", head=0), resid.Site(17, "attn", head=4), resid.Site(12, "mlp", positions=[9])]
    df = _patch(smollm2, sites).set_index(["prompt_idx", "site"])
    clean = smollm2.run(CLEAN, capture=resid.Capture(attn={"z"})).stream
    for site in sites:
        if site.head is not None:
            value = clean.layers[site.layer].attn.z[..., site.head, :]
        else:
            at = smollm2.to_tokens(CLEAN).padded_index(site.positions)[:, 0]
            value = clean.layers[site.layer].mlp.out[torch.arange(len(NAMES)), at][:, None]
        logits = smollm2.run(CORRUPT, interventions=[resid.Replace(site, value)], logits_at="last").logits[:, 0]
        for i, expected in enumerate(_logit_diffs(smollm2, logits)):
            assert df.loc[(i, site.label), "patched_metric"] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_resid_patching_resumes_after_a_crash(gpt2_tokenizer, tmp_path, monkeypatch, suffix):
    """With out=, a run killed after its first chunk resumes: the finished pair is not computed again and the
    result equals an uninterrupted run."""
    from random_models import make_random_model

    from resid.analyses.sweeps import chunks

    model = make_random_model("gpt2_like", gpt2_tokenizer)
    expected = _patch(model, "resid_pre")
    out, calls = tmp_path / f"resid{suffix}", []
    clean_pass = chunks.clean_pass

    def failing(ctx, sequences, pad, group, *rest):
        calls.append(list(group))
        if len(calls) == 2:
            raise RuntimeError("killed")
        return clean_pass(ctx, sequences, pad, group, *rest)

    monkeypatch.setattr(chunks, "clean_pass", failing)
    with pytest.raises(RuntimeError, match="killed"):
        _patch(model, "resid_pre", execution=Execution(batch_size=1, out=out))
    resumed = _patch(model, "resid_pre", execution=Execution(batch_size=1, out=out))
    assert calls == [[0], [1], [1]]  # pair 0 was stored before the crash and not recomputed
    assert list(resumed["site"]) == list(expected["site"])
    assert resumed["patched_metric"].to_numpy() == pytest.approx(expected["patched_metric"].to_numpy(),
                                                                 abs=TINY["atol"])
    assert resumed["score"].to_numpy() == pytest.approx(expected["score"].to_numpy(), abs=TINY["atol"], nan_ok=True)
    assert out.exists()


def test_activation_atp_and_path_share_their_parameters():
    """The common parameters come in one order with one default each (resid.analyses.patching's table); the method's
    own (atp's method, path's senders and receivers) and `execution` close each list."""
    import inspect

    common = ["model", "pairs", "corrupt", "targets", "baselines"]  # corrupt...: the old arguments, for one release
    shared = ["sites", "direction", "metric", "align", "dictionaries", "source", "corrupt_source"]
    params = {f.__name__: inspect.signature(f).parameters for f in (patching.activation, patching.atp, patching.path)}
    assert list(params["activation"]) == [*common, *shared, "execution"]
    assert list(params["atp"]) == [*common, *shared, "method", "execution"]
    assert list(params["path"]) == [*common, "senders", "receivers", "direction", "metric", "execution"]
    for name in ("baselines", "metric", "execution"):
        assert len({params[f][name].default for f in params}) == 1, name
    # path's direction defaults to None, which warns that it patches "denoise" (its default was "noise" before)
    assert params["activation"]["direction"].default == params["atp"]["direction"].default == "denoise"
    for name in shared:
        assert params["activation"][name].default == params["atp"][name].default, name
        assert params["activation"][name].annotation == params["atp"][name].annotation, name
    assert params["path"]["direction"].default is None and params["atp"]["sites"].default == "resid_pre"


def test_sites_are_words_sites_and_labels_for_exact_and_atp_alike(random_model):
    mixed = ["sublayer", resid.Site(1, "attn", head=2), "layers[0].attn.head[1]"]
    exact = _patch(random_model, mixed)
    estimate = patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=mixed)
    n_layers = random_model.config.n_layers
    labels = [*(f"layers[{l}].{part}" for l in range(n_layers) for part in ("attn", "mlp")),
              "layers[1].attn.head[2]", "layers[0].attn.head[1]"]
    for table in (exact, estimate):
        assert table["site"].tolist() == labels * 2  # pair-major, each pair in the order `sites` names them
    # the rows of the named heads are those of the word's own call (AtP: the same backward, filtered)
    heads = patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head").set_index(["prompt_idx",
                                                                                                     "site"])
    named = estimate[estimate["head"].notna()].set_index(["prompt_idx", "site"])
    assert named["patched_metric"].to_numpy() == pytest.approx(
        heads.loc[named.index, "patched_metric"].to_numpy(), abs=TINY["atol"])
    assert patching.compare(estimate, exact, k=3)["sites"] == len(labels)
    with pytest.raises(ResidError, match="names the same site twice .*layers\\[0\\].attn.head\\[1\\]"):
        patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=["head", "layers[0].attn.head[1]"])
    with pytest.raises(ResidError, match="'haed' is neither a word"):
        _patch(random_model, ["sublayer", "haed"])
    with pytest.raises(ResidError, match="no estimate for layers\\[0\\].resid_post"):
        patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=["layers[0].resid_post@3"])
    with pytest.raises(ResidError, match="sites must be one of"):
        patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=["head", "layer"])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_every_method_shows_progress_on_a_terminal_unless_told_not_to(random_model, monkeypatch):
    shown = _Terminal()
    monkeypatch.setattr(sys, "stderr", shown)
    _patch(random_model, "sublayer")
    patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head")
    patching.path(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, senders=[resid.Site(0, "mlp")])
    for name in ("sites (", "attribution patching (", "path patching ("):
        assert name in shown.getvalue(), name
    quiet = _Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    _patch(random_model, "sublayer", execution=Execution(progress=False))
    assert quiet.getvalue() == ""


def test_deepseek_head_and_expert_patching_equal_one_forward_per_site(gpt2_tokenizer):
    """Latent attention's heads (z narrower than q and k) and a mixture's experts, shared ones included, patch as
    any head and expert; AtP estimates the heads."""
    from moe_models import make_deepseek_model
    model = make_deepseek_model(gpt2_tokenizer)
    df = _patch(model, ["head", "expert"]).set_index(["prompt_idx", "site"])
    clean = model.run(CLEAN, capture=resid.Capture(attn={"z"}, mlp={"expert_out"})).stream
    for site, value in [(resid.Site(1, "attn", head=2), clean.layers[1].attn.z[..., 2, :]),
                        (resid.Site(2, "mlp", expert=4), clean.layers[2].mlp.expert_out[..., 4, :])]:
        logits = model.run(CORRUPT, interventions=[resid.Replace(site, value)], logits_at="last").logits[:, 0]
        for i, expected in enumerate(_logit_diffs(model, logits)):
            assert df.loc[(i, site.label), "patched_metric"] == pytest.approx(expected, abs=1e-5)
    estimates = patching.atp(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head")
    assert len(estimates) == 2 * 3 * 4 and estimates["patched_metric"].notna().all()  # pairs x layers x heads


def test_a_pairs_value_carries_what_the_three_methods_share(random_model):
    """patching.Pairs (prompts, targets, baselines, metric, alignment) gives each method the table of its old
    separate arguments, which still work for one release with a DeprecationWarning; a Pairs beside old arguments, and
    an alignment for path patching, are refused with what to do."""
    import warnings

    pairs = patching.Pairs(CLEAN, CORRUPT, TARGETS, BASELINES, metric="logit_diff")
    senders = [resid.Site(0, "attn"), resid.Site(1, "mlp")]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the Pairs call is the current one
        new = [patching.activation(random_model, pairs, sites="sublayer"),
               patching.atp(random_model, pairs, sites="sublayer"),
               patching.path(random_model, pairs, senders=senders, direction="denoise")]
    with pytest.warns(DeprecationWarning, match=r"patching.activation\(model, clean, corrupt, targets, baselines, "
                                                r"metric=..., align=...\) is deprecated.*patching.Pairs"):
        old = [patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="sublayer",
                                   metric="logit_diff")]
    with pytest.warns(DeprecationWarning):
        old += [patching.atp(random_model, CLEAN, CORRUPT, targets=TARGETS, baselines=BASELINES, sites="sublayer"),
                patching.path(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, senders=senders, direction="denoise")]
    for a, b in zip(new, old, strict=True):
        assert len(a) > 0 and list(a.columns) == list(b.columns)
        assert a["patched_metric"].to_numpy() == pytest.approx(b["patched_metric"].to_numpy(), abs=TINY["atol"])
    assert (new[0]["metric"] == "logit_diff").all()
    with pytest.raises(ResidError, match=r"patching.atp was given a patching.Pairs value and baselines, align: those "
                                         r"belong to the Pairs .*drop them here"):
        patching.atp(random_model, pairs, baselines=BASELINES, align="end")
    with pytest.raises(ResidError, match=r"patching.activation takes the pairs as one value: .*patching.Pairs\(clean"):
        patching.activation(random_model, CLEAN)
    with pytest.raises(ResidError, match=r"Path patching takes pairs of equal token lengths.*drop align="):
        patching.path(random_model, patching.Pairs(CLEAN, CORRUPT, TARGETS, align="end"), senders=senders,
                      direction="denoise")
