"""Attribution to the features of many dictionaries at once: each dictionary's rows sum to the contribution of the
tensor it reconstructs, and equal the rows of attribution.direct with that dictionary alone."""

import pytest
import torch
from numerics import EXACT
from random_dictionaries import random_dictionary
from random_models import make_random_model

from resid.analyses import attribution
from resid.analyses.features.by_dictionary import COLUMNS, by_dictionary


@pytest.mark.parametrize("kind", ["llama_gqa", "gemma3_like", "olmo2_like"])  # the last two: attention post-norms
def test_each_dictionary_sums_to_what_it_reconstructs(kind: str) -> None:
    model = make_random_model(kind)
    ids = torch.randint(0, model.config.d_vocab, (3, 9), generator=torch.Generator().manual_seed(0))
    dictionaries = [random_dictionary(model, "blocks.0.hook_resid_post", seed=1, name="r0"),
                    random_dictionary(model, "blocks.1.hook_resid_pre", seed=2, name="r1"),
                    random_dictionary(model, "blocks.1.hook_mlp_out", seed=3, name="m1"),
                    random_dictionary(model, "blocks.2.attn.hook_z", seed=4, name="z2")]
    df = by_dictionary(model, ids, dictionaries)
    assert list(df.columns) == list(COLUMNS) and (df[df["feature"].notna()]["activation"] > 0).all()
    plain = attribution.direct(model, ids, level="head")
    sums = df.groupby(["dictionary", "prompt_idx"])["value"].sum()
    before = plain[plain["part"].isin(["embed"]) | (plain["layer"] == 0).fillna(False)].groupby("prompt_idx")["value"]
    for name in ("r0", "r1"):  # the residual after layer 0 is the residual entering layer 1
        torch.testing.assert_close(torch.tensor(sums[name].to_numpy()), torch.tensor(before.sum().to_numpy()), **EXACT)
    mlp = plain[plain["site"] == "layers[1].mlp"]["value"].to_numpy()
    torch.testing.assert_close(torch.tensor(sums["m1"].to_numpy()), torch.tensor(mlp), **EXACT)
    heads = plain[plain["site"].str.startswith("layers[2].attn.head")].groupby("prompt_idx")["value"].sum()
    torch.testing.assert_close(torch.tensor(sums["z2"].to_numpy()), torch.tensor(heads.to_numpy()), **EXACT)
    alone = attribution.direct(model, ids, dictionaries=[dictionaries[2]])
    mine = df[df["dictionary"] == "m1"]
    merged = mine.merge(alone, on=["prompt_idx", "site"], suffixes=("", "_direct"))
    assert len(merged) == len(mine)
    torch.testing.assert_close(torch.tensor(merged["value"].to_numpy()),
                               torch.tensor(merged["value_direct"].to_numpy()), **EXACT)
