"""One input path: every analysis takes what model.run takes (texts, Tokens, token ids), tokenizes once, and
gives the same numbers whichever form the prompts came in; models without a tokenizer work from ids."""

import pandas as pd
import torch
from random_models import make_random_model

from resid.analyses import ablation, attribution, logit_lens, neurons

TEXTS = ["The quick brown fox jumps over", "Hello there"]


def _same(a: pd.DataFrame, b: pd.DataFrame, columns: list[str]) -> None:
    pd.testing.assert_frame_equal(a[columns].reset_index(drop=True), b[columns].reset_index(drop=True),
                                  check_exact=False, atol=1e-5, rtol=1e-5)


def test_texts_tokens_and_ids_give_the_same_tables(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    tokens = model.to_tokens(TEXTS, padding_side="right")
    one_ids = tokens.ids[1:, : int(tokens.lengths[1])]  # an unpadded [1 pos] tensor of the second prompt
    by_text = attribution.direct(model, TEXTS, targets=" the", level="head")
    by_tokens = attribution.direct(model, tokens, targets=" the", level="head")
    _same(by_text, by_tokens, ["prompt_idx", "pos", "token", "site", "value", "logit"])
    by_ids = attribution.direct(model, one_ids, targets=" the", level="head")
    _same(by_text[by_text["prompt_idx"] == 1], by_ids.assign(prompt_idx=1), ["pos", "site", "value", "logit"])
    assert by_ids.attrs["provenance"]["prompts"] == [one_ids[0].tolist()]

    lens_text = logit_lens.run(model, TEXTS, positions="all")
    lens_tokens = logit_lens.run(model, tokens, positions="all")
    _same(lens_text, lens_tokens, ["prompt_idx", "pos", "site", "rank", "token_id", "prob", "kl_to_final"])

    _same(neurons.sub_updates(model, TEXTS[1]), neurons.sub_updates(model, one_ids),
          ["layer", "ranking", "neuron", "coefficient", "target_contribution"])

    sweep_text = ablation.sweep(model, TEXTS, " the", sites="sublayer")
    sweep_tokens = ablation.sweep(model, tokens, " the", sites="sublayer")
    _same(sweep_text, sweep_tokens, ["prompt_idx", "site", "clean_metric", "ablated_metric"])


def test_a_model_without_a_tokenizer_runs_every_analysis_from_ids():
    model = make_random_model("gpt2_like")  # no tokenizer: tokens shown as <id>
    ids = torch.randint(0, model.config.d_vocab, (3, 6), generator=torch.Generator().manual_seed(0))
    df = attribution.direct(model, ids, targets=5, level="neuron")
    sums = df.groupby("prompt_idx")["value"].sum()
    torch.testing.assert_close(torch.tensor(sums.values),
                               torch.tensor(df.groupby("prompt_idx")["logit"].first().values),
                               atol=1e-4, rtol=1e-5)
    assert df["token"].str.match(r"<\d+>").all()
    lens = logit_lens.run(model, ids, positions=[0, -1], every="layer")
    assert set(lens["pos"]) == {0, 5} and len(lens["prompt_idx"].unique()) == 3
    sweep = ablation.sweep(model, ids, 5, sites="layer")
    assert len(sweep) == 3 * model.config.n_layers
