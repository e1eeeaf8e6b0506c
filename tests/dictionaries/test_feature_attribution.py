"""Direct attribution to dictionary features, on every tiny family: the rows (one per active feature, plus the
decoder bias, skip and error terms) sum to the logit and to each write they replace."""

import pandas as pd
import pytest
import torch
from numerics import EXACT
from random_dictionaries import random_dictionary
from tiny_fixtures import random_ids

import resid
from resid.analyses import attribution


def _sum(df: pd.DataFrame, mask) -> pd.Series:
    return df[mask].groupby("prompt_idx")["value"].sum()


def _assert_rows_sum_to_logit(df: pd.DataFrame) -> None:
    sums = df.groupby("prompt_idx").agg(value=("value", "sum"), logit=("logit", "first"))
    torch.testing.assert_close(torch.tensor(sums["value"].to_numpy()), torch.tensor(sums["logit"].to_numpy()),
                               rtol=1e-5, atol=1e-5 * float(sums["logit"].abs().max()))


@pytest.mark.parametrize("level", ["sublayer", "head"])
def test_sublayer_dictionaries_split_their_writes_exactly(tiny, level) -> None:
    model, ids = tiny.model, random_ids(2)[:, :10]
    mlp_in = "blocks.1.ln2.hook_normalized" if model.config.pre_norms else "blocks.1.hook_mlp_in"
    dictionaries = [random_dictionary(model, "blocks.0.hook_attn_out", seed=1, name="attn0"),
                    random_dictionary(model, "blocks.1.attn.hook_z", seed=2, name="z1"),
                    random_dictionary(model, mlp_in, "blocks.1.hook_mlp_out", skip=True, seed=3, name="tc1")]
    plain = attribution.direct(model, ids, level=level)
    df = attribution.direct(model, ids, level=level, dictionaries=dictionaries)
    _assert_rows_sum_to_logit(df)
    for layer, part in ((0, "attn"), (1, "attn"), (1, "mlp")):  # the rows of each replaced write sum to it
        replaced = _sum(plain, (plain["layer"] == layer) & (plain["part"] == part))
        torch.testing.assert_close(torch.tensor(_sum(df, (df["layer"] == layer) & (df["part"] == part)).to_numpy()),
                                   torch.tensor(replaced.to_numpy()), **EXACT)
    feature_rows = df[df["feature"].notna()]
    assert len(feature_rows) and (feature_rows["activation"] > 0).all()
    assert {"layers[1].mlp.skip", "layers[1].mlp.error", "layers[1].attn.b_dec"} <= set(df["site"])
    # each feature row's activation is the dictionary's at the attributed position
    run = model.run(ids, dictionaries=dictionaries)
    for row in feature_rows.head(20).itertuples():
        site = resid.Site.parse(row.site)
        value = run.read(site)[row.prompt_idx, ids.shape[1] - 1]
        assert abs(float(value) - row.activation) <= 1e-5 * max(1.0, abs(row.activation))
        assert resid.Site.parse(row.site).label == row.site


def test_a_residual_dictionary_replaces_every_write_before_it(tiny) -> None:
    model, ids = tiny.model, random_ids(4)[:, :10]
    sae = random_dictionary(model, "blocks.0.hook_resid_post", seed=5, name="r0")
    plain = attribution.direct(model, ids)
    df = attribution.direct(model, ids, dictionaries=[sae])
    _assert_rows_sum_to_logit(df)
    before = plain["part"].isin(["embed", "pos_embed", "type_embed"]) | (plain["layer"] == 0).fillna(False)
    at_site = df["site"].str.startswith("layers[0].resid_post")
    torch.testing.assert_close(torch.tensor(_sum(df, at_site).to_numpy()), torch.tensor(_sum(plain, before).to_numpy()),
                               **EXACT)
    assert not (df["part"].isin(["embed", "pos_embed"]) | ((df["layer"] == 0).fillna(False) & ~at_site)).any()
    later = df[~at_site]
    torch.testing.assert_close(torch.tensor(later["value"].to_numpy()),
                               torch.tensor(plain[~before]["value"].to_numpy()), **EXACT)
