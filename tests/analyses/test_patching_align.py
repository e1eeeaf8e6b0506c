"""Patching pairs of different token lengths through an alignment (resid.analyses.patching.pairs): the aligned positions
are patched, named by the clean prompt's positions, and each value agrees with one forward written here."""

import pytest
from bad_option import BAD_OPTION
from numerics import TINY

import resid
from resid.analyses import patching
from resid.errors import ResidError

CLEAN = ["When Mary and John went to the store, John gave a drink to"]
CORRUPT = ["When Mary and John went to the big old store, Mary gave a drink to"]  # two tokens longer
TARGETS, BASELINES = [" Mary"], [" John"]


def _metric(model, logits) -> float:
    return (logits[0, model.to_single_token(" Mary")] - logits[0, model.to_single_token(" John")]).item()


@pytest.fixture
def lengths(random_model):
    clean, corrupt = (int(random_model.to_tokens(p).lengths[0]) for p in (CLEAN, CORRUPT))
    assert corrupt == clean + 2
    return clean, corrupt


def test_end_alignment_patches_from_the_last_token_back(random_model, lengths):
    """Denoising resid_pre(l) at clean position p puts the clean residual at p into the corrupt prompt's position
    p + 2 (aligned from the end): one forward adding the difference to the write before it."""
    n_clean, _ = lengths
    df = patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, align="end")
    assert len(df) == random_model.config.n_layers * n_clean and df["position"].max() == n_clean - 1
    df = df.set_index("site")
    clean, corrupt = random_model.run(CLEAN).stream, random_model.run(CORRUPT).stream
    for layer, position in [(1, n_clean - 1), (2, 9), (2, 3)]:
        delta = clean.resid_pre(layer)[:, position] - corrupt.resid_pre(layer)[:, position + 2]
        site = resid.Site(layer - 1, "mlp", positions=[position + 2])
        logits = random_model.run(CORRUPT, interventions=[resid.Add(site, delta[:, None])], logits_at="last")
        assert df.loc[f"layers[{layer}].resid_pre@{position}", "patched_metric"] == pytest.approx(
            _metric(random_model, logits.logits[:, 0]), abs=1e-4)


def test_noising_and_explicit_alignments(random_model, lengths):
    n_clean, _ = lengths
    chosen = [[(0, 0), (9, 11), (n_clean - 1, n_clean + 1)]]
    explicit = patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, align=chosen, direction="noise")
    end = patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, align="end", direction="noise")
    assert sorted(set(explicit["position"])) == [0, 9, n_clean - 1]
    alike = explicit[explicit["position"] != 0]  # (9, 11) and the last tokens: paired as align="end" pairs them
    both = alike.merge(end, on="site", suffixes=("", "_end"))
    assert len(both) == 2 * random_model.config.n_layers
    assert both["patched_metric"].to_numpy() == pytest.approx(both["patched_metric_end"].to_numpy(), abs=1e-5)


def test_alignment_of_equal_lengths_changes_nothing(random_model):
    clean = ["When Mary and John went to the store, John gave a drink to"]
    corrupt = ["When Mary and John went to the store, Mary gave a drink to"]
    for analysis in (patching.activation, patching.atp):
        plain = analysis(random_model, clean, corrupt, TARGETS, BASELINES, sites="resid_pre")
        aligned = analysis(random_model, clean, corrupt, TARGETS, BASELINES, sites="resid_pre", align="end")
        assert list(plain["site"]) == list(aligned["site"])
        assert plain["patched_metric"].to_numpy() == pytest.approx(aligned["patched_metric"].to_numpy(),
                                                                   abs=TINY["atol"])


def test_atp_with_an_alignment_is_the_linear_limit(random_model, lengths):
    """AtP of resid_pre(2) at clean position 9: moving the corrupt residual at position 11 alpha of the way to the
    clean one, exact / alpha tends to the estimate; sublayer estimates use the same aligned differences."""
    estimate = patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=("resid_pre", "head"),
                                    align="end").set_index("site")
    row = estimate.loc["layers[2].resid_pre@9"]
    expected = row["patched_metric"] - row["corrupt_metric"]
    clean, corrupt = random_model.run(CLEAN).stream, random_model.run(CORRUPT).stream
    delta = (clean.resid_pre(2)[:, 9] - corrupt.resid_pre(2)[:, 11])[:, None]
    base = _metric(random_model, random_model.run(CORRUPT, logits_at="last").logits[:, 0])
    errors = []
    for alpha in (0.1, 0.01, 0.001):
        edit = resid.Add(resid.Site(1, "mlp", positions=[11]), alpha * delta)
        logits = random_model.run(CORRUPT, interventions=[edit], logits_at="last").logits[:, 0]
        errors.append(abs((_metric(random_model, logits) - base) / alpha - expected))
    assert errors[-1] < max(errors[0] / 10, 1e-3)
    assert "layers[0].attn.head[0]" in estimate.index


def test_bad_alignments(random_model, lengths):
    n_clean, n_corrupt = lengths
    with pytest.raises(ResidError, match="or an alignment: align='end'"):
        patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES)
    with pytest.raises(ResidError, match="needs pairs of equal token lengths"):
        patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head", align="end")
    with pytest.raises(ResidError, match="needs pairs of equal token lengths"):
        patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="pattern", align="end")
    with pytest.raises(BAD_OPTION, match=r"(?s)align.*'end'"):
        patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, align="start")
    with pytest.raises(ResidError, match=f"out of range: the clean prompt has {n_clean} tokens"):
        patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, align=[[(0, n_corrupt)]])
    with pytest.raises(ResidError, match="names a position twice"):
        patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, align=[[(0, 0), (1, 0)]])
    with pytest.raises(ResidError, match="1 alignments for 2 pairs"):
        patching.activation(random_model, CLEAN * 2, CORRUPT * 2, TARGETS * 2, BASELINES * 2, align=[[(0, 0)]])
