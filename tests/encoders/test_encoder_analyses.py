"""Analyses and the CLI on encoders: ablation and the logit lens read a masked-LM's prediction at the [MASK],
`resid decompose` decomposes it, and an embedding model or an encoder-decoder model gets a clear error where
an analysis needs what it does not have."""

import re

import pytest
import torch

import resid
from resid.analyses import ablation, attribution, logit_lens
from resid.analyses.cli.main import main
from resid.errors import ResidError

TEXTS = ["Paris is the [MASK] of France.", "the [MASK] sat on the mat"]


def test_ablation_is_measured_at_the_mask(bert_mlm):
    model = bert_mlm.model
    df = ablation.sweep(model, TEXTS, ["paris", "cat"], sites="sublayer", metric="logit")
    for i, (text, target) in enumerate(zip(TEXTS, ["paris", "cat"])):
        mask = model.to_str_tokens(text).index("[MASK]")
        for site in ("attn", "mlp"):
            ablated = model.run(text, interventions=[resid.ZeroAblate(resid.Site(1, site))]).logits
            row = df[(df.prompt_idx == i) & (df.site == f"layers[1].{site}")]
            assert row.ablated_metric.item() == pytest.approx(ablated[0, mask, model.to_single_token(target)].item(),
                                                              abs=1e-5)


def test_logit_lens_last_site_is_the_prediction_at_the_mask(bert_mlm):
    model = bert_mlm.model
    lens = logit_lens.run(model, TEXTS[0], positions=[4], k=1)
    last = lens[lens.site == f"layers[{model.config.n_layers - 1}].resid_post"]
    assert last["token_id"].item() == model.run(TEXTS[0]).logits[0, 4].argmax().item()


def test_embedding_and_encoder_decoder_models_are_refused_clearly(bert_base, tmp_path):
    with pytest.raises(ResidError, match="embedding model.*Probe"):
        ablation.sweep(bert_base.model, ["the cat"], ["cat"])
    with pytest.raises(ResidError, match="embedding model"):
        logit_lens.run(bert_base.model, "the cat")
    from seq2seq_models import vanilla

    _, seq2seq = vanilla()
    with pytest.raises(ResidError, match="encoder-decoder model: pass source="):  # sweeps take source=
        ablation.sweep(seq2seq, torch.tensor([[1, 2]]), [3])


def test_decompose_cli_at_the_mask(bert_mlm, capsys):
    assert main(["decompose", TEXTS[0], "--model", str(bert_mlm.folder), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "top predictions for '[MASK]' (position 4):" in out
    assert "logit lens at the [MASK] (position 4)" in out
    total, actual = map(float, re.search(r"components = (\S+); model logit\(.*\) = (\S+);", out).groups())
    assert total == pytest.approx(actual, abs=1e-4)
    expected = attribution.direct(bert_mlm.model, TEXTS[0], level="head")
    assert actual == pytest.approx(expected["logit"].iloc[0], abs=1e-4)


def test_decompose_cli_errors(bert_mlm, bert_base, capsys):
    assert main(["decompose", "paris is the capital", "--model", str(bert_mlm.folder)]) == 2
    assert "0 [MASK] tokens" in capsys.readouterr().err
    assert main(["decompose", "paris is the capital", "--model", str(bert_base.folder)]) == 2
    assert "embedding model" in capsys.readouterr().err


def test_generate_refuses_encoders(bert_mlm):
    with pytest.raises(ResidError, match="causal language model.*encoder"):
        bert_mlm.model.generate("paris is the", max_new_tokens=2)
