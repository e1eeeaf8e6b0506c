"""evaluate(): a dictionary that reconstructs exactly (features +e_i and -e_i) scores FVU 0, all CE loss recovered
and no KL; a trained one scores between the clean and the zero-ablated model; the numbers agree with their
definitions computed here from plain runs."""

import pytest
import torch

from resid.analyses.corpus_windows import cut_windows
from resid.analyses.distributed.execution import Execution
from resid.analyses.training.evaluation import evaluate
from resid.analyses.training.loop import train
from resid.analyses.training.recipe import Recipe
from resid.dictionaries import Binding, Dictionary, Weights, check
from resid.errors import ResidError
from resid.sites import Site

HOOK = "blocks.1.hook_resid_post"


def _exact(model) -> Dictionary:
    d = model.config.d_model
    eye = torch.eye(d)
    return check(Dictionary(Weights(torch.cat([eye, -eye], 1), torch.cat([eye, -eye]), torch.zeros(d),
                                    torch.zeros(2 * d)), binding=Binding(HOOK), name="exact"), model)


@pytest.mark.parametrize("splice_bos", [False, True])
def test_an_exact_dictionary_recovers_everything(bos_model, texts, splice_bos: bool) -> None:
    row = evaluate(bos_model, _exact(bos_model), texts, max_windows=6, window=24, splice_bos=splice_bos).iloc[0]
    assert row.fvu == pytest.approx(0, abs=1e-6)
    assert row.ce_loss_recovered == pytest.approx(1, abs=1e-4)
    assert row.kl_spliced == pytest.approx(0, abs=1e-5)
    assert abs(row.ce_zero_ablated - row.ce_clean) > 1e-3  # zeroing the residual changes the predictions
    # ce_clean from its definition: next-token NLL at each non-BOS real token whose next token is real
    nll, n = 0.0, 0
    for w in cut_windows(bos_model, texts, 24)[:6]:
        logp = torch.log_softmax(bos_model.run(torch.as_tensor(w.ids)[None]).logits[0].float(), -1)
        ids = torch.as_tensor(w.ids)
        nll -= float(logp[1:-1].gather(1, ids[2:, None]).sum())
        n += len(ids) - 2
    assert row.ce_clean == pytest.approx(nll / n, rel=1e-4)
    assert row.l0 == pytest.approx(bos_model.config.d_model, abs=2)  # one of +e_i, -e_i per dimension
    assert row.dead_fraction == 0 and row.tokens > 50


def test_a_trained_dictionary_lies_between_clean_and_ablated(bos_model, texts) -> None:
    recipe = Recipe(activation="topk", k=8, d_sae=128, steps=30, batch_size=128, warmup_steps=3)
    sae = train(bos_model, texts, [Site(1, "resid_post")], recipe, Execution(progress=False), window=24,
                buffer_tokens=150)[0]
    df = evaluate(bos_model, [sae, _exact(bos_model)], texts, max_windows=6, window=24)
    row = df.set_index("dictionary").loc[HOOK]
    assert row.site == row.site_in == "layers[1].resid_post"
    assert 0 < row.fvu < 1 and 0 < row.l0 <= 8
    gap = row.ce_zero_ablated - row.ce_clean
    assert row.ce_loss_recovered == pytest.approx(1 - (row.ce_spliced - row.ce_clean) / gap)
    assert 0 <= row.dead_fraction <= 1 and 0 <= row.dense_fraction <= 1
    assert row.kl_spliced > 0
    assert "provenance" in df.attrs


def test_splicing_bos_or_not_differs_only_through_bos(bos_model, texts) -> None:
    """A dictionary that zeroes everything: spliced everywhere it also zeroes BOS, which changes the CE; spliced at
    the training positions, its spliced CE is exactly the zero-ablated one."""
    zero = _exact(bos_model)
    with torch.no_grad():
        zero.W_dec.zero_()
    kept = evaluate(bos_model, zero, texts, max_windows=4, window=24).iloc[0]
    everywhere = evaluate(bos_model, zero, texts, max_windows=4, window=24, splice_bos=True).iloc[0]
    assert kept.ce_spliced == pytest.approx(kept.ce_zero_ablated, rel=1e-6)
    assert everywhere.ce_spliced == pytest.approx(everywhere.ce_zero_ablated, rel=1e-6)
    assert abs(kept.ce_spliced - everywhere.ce_spliced) > 1e-3


def test_tokens_far_above_the_median_norm_are_neither_counted_nor_spliced(bos_model, texts) -> None:
    zero = _exact(bos_model)
    with torch.no_grad():
        zero.W_dec.zero_()
    every = evaluate(bos_model, zero, texts, max_windows=4, window=24, max_norm_ratio=None).iloc[0]
    some = evaluate(bos_model, zero, texts, max_windows=4, window=24, max_norm_ratio=1.1).iloc[0]
    assert 0 < some.tokens < every.tokens  # the tokens above 1.1 x the median norm are left out of the sums
    assert some.ce_clean == pytest.approx(every.ce_clean, rel=1e-6)  # the same predictions are scored
    # ... but those tokens keep their residual in the spliced run: zeroing the rest hurts less than zeroing all
    assert some.ce_spliced == pytest.approx(some.ce_zero_ablated, rel=1e-6)
    assert abs(some.ce_spliced - every.ce_spliced) > 1e-4
    with pytest.raises(ResidError, match=r"max_norm_ratio=0\.5 must be a number above 1 \(a multiple of the median "
                                         r"norm\), or None to keep every token"):
        evaluate(bos_model, zero, texts, max_windows=4, window=24, max_norm_ratio=0.5)
