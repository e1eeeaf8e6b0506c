"""Evaluating lenses per site: every metric equals a brute-force computation over the same tokens, the last site is
the model for every lens, the result does not depend on the batching, and the figure has a trace per lens and
metric."""

import pytest
import torch
from random_models import make_random_model

import resid
from resid.analyses import tuned_lens
from resid.analyses.distributed.execution import Execution
from resid.analyses.lenses import Translators, TunedLens
from resid.sites import Site

QUIET = Execution(progress=False)


@pytest.fixture(scope="module")
def model() -> resid.Transformer:
    return make_random_model("gpt2_like")


@pytest.fixture(scope="module")
def lens(model) -> TunedLens:
    sites = tuned_lens.site_list(model, "layer")[:-1]
    generator = torch.Generator().manual_seed(2)
    d = model.config.d_model
    return TunedLens(model, Translators(tuple(sites), 0.2 * torch.randn(len(sites), d, d, generator=generator),
                                        0.2 * torch.randn(len(sites), d, generator=generator)))


@pytest.fixture(scope="module")
def windows(model) -> torch.Tensor:
    return torch.randint(0, model.config.d_vocab, (5, 7), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def brute_force(model, lens, windows) -> dict:
    run = model.run(windows)
    logp = torch.log_softmax(run.logits.double(), -1)
    expected = {}
    for site, resid_ in run.stream.running("layer"):
        logq = torch.log_softmax(lens.logits(resid_, site).double(), -1)
        ce = -logq[:, :-1].gather(-1, windows[:, 1:, None]).mean()
        expected[site.label] = {
            "ce": ce.item(),
            "kl": (logp.exp() * (logp - logq)).sum(-1).mean().item(),
            "entropy": -(logq.exp() * logq).sum(-1).mean().item(),
            "top1": (logq.argmax(-1) == logp.argmax(-1)).double().mean().item(),
        }
    return expected


def test_metrics_equal_a_brute_force_computation(model, lens, windows):
    df = tuned_lens.evaluate(model, windows, [lens], execution=QUIET)
    assert list(df["lens"].unique()) == ["logit", "tuned"] and (df["tokens"] == windows.numel()).all()
    for reader in (tuned_lens.LogitLens(model), lens):
        expected = brute_force(model, reader, windows)
        rows = df[df["lens"] == reader.name]
        assert list(rows["site"]) == list(expected)
        assert list(rows["layer"]) == [Site.parse(label).layer for label in expected]
        for _, row in rows.iterrows():
            for metric, value in expected[row["site"]].items():
                assert row[metric] == pytest.approx(value, rel=1e-5, abs=1e-6), (reader.name, row["label"], metric)
    final = df[df["label"] == f"L{model.config.n_layers - 1} post"]
    assert (final["kl"].abs() < 1e-6).all() and (final["top1"] == 1).all() and final["ce"].nunique() == 1


def test_the_batching_changes_nothing(model, lens, windows):
    one = tuned_lens.evaluate(model, windows, [lens], execution=Execution(batch_size=1, progress=False))
    all_ = tuned_lens.evaluate(model, windows, [lens], execution=Execution(batch_size=5, progress=False))
    for metric in ("ce", "kl", "entropy", "top1"):
        torch.testing.assert_close(torch.tensor(one[metric].values), torch.tensor(all_[metric].values),
                                   rtol=1e-5, atol=1e-6)


def test_the_figure_has_a_line_per_lens_and_metric(model, lens, windows):
    fig = tuned_lens.figure(tuned_lens.evaluate(model, windows, [lens], execution=QUIET))
    assert len(fig.data) == 8 and {trace.name for trace in fig.data} == {"logit lens", "tuned lens"}
    colors = {(trace.name, trace.line.color) for trace in fig.data}  # a lens has one colour in every panel
    assert len(colors) == 2 and len({color for _, color in colors}) == 2


def test_two_lenses_of_one_kind_are_refused(model, lens, windows):
    with pytest.raises(resid.ResidError, match="one lens of each kind"):
        tuned_lens.evaluate(model, windows, [lens, lens], execution=QUIET)
