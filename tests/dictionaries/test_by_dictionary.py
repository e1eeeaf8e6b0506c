"""Attribution to the features of many dictionaries at once: each dictionary's rows sum to the contribution of the
tensor it reconstructs, and equal the rows of attribution.direct with that dictionary alone."""

import pytest
import torch
from numerics import EXACT
from random_dictionaries import random_dictionary
from random_models import make_random_model

from resid import Site, ZeroAblate
from resid.analyses import attribution
from resid.analyses.features.by_dictionary import COLUMNS, by_dictionary
from resid.errors import ResidError


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


def test_two_dictionaries_at_one_site_name_themselves_in_their_sites() -> None:
    """Two SAEs on one site: their rows' Sites name their dictionary (labels parse back, never collide), and a
    feature intervention on a named Site edits that dictionary's feature, not the other's."""
    model = make_random_model("llama_gqa")
    ids = torch.randint(0, model.config.d_vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    a = random_dictionary(model, "blocks.1.hook_resid_post", seed=1, name="a")
    b = random_dictionary(model, "blocks.1.hook_resid_post", seed=2, name="b")
    other = random_dictionary(model, "blocks.0.hook_mlp_out", seed=3, name="m0")
    df = by_dictionary(model, ids, [a, b, other])
    sites = [Site.parse(label) for label in df["site"]]
    assert [s.label for s in sites] == list(df["site"])
    assert {s.dictionary for s in sites if s.layer == 1} == {"a", "b"}
    assert all(s.dictionary is None for s in sites if s.layer == 0)  # alone at its site: the label is unchanged
    assert not df.duplicated(["prompt_idx", "site"]).any()
    feature = int(df[(df["dictionary"] == "b") & df["feature"].notna()]["feature"].iloc[0])
    site = Site(1, "resid_post", feature=feature, dictionary="b")
    run = model.run(ids, dictionaries=[a, b], interventions=[ZeroAblate(site)])
    only_b = model.run(ids, dictionaries=[b], interventions=[ZeroAblate(Site(1, "resid_post", feature=feature))])
    in_a = model.run(ids, dictionaries=[a], interventions=[ZeroAblate(Site(1, "resid_post", feature=feature))])
    torch.testing.assert_close(run.logits, only_b.logits, **EXACT)
    assert not torch.allclose(run.logits, in_a.logits) and not torch.allclose(run.logits, model.run(ids).logits)
    torch.testing.assert_close(run.read(site), run.dictionaries["b"].feature(feature), **EXACT)
    with pytest.raises(ResidError, match=r"several do \('a', 'b'\): name it"):
        model.run(ids, dictionaries=[a, b], interventions=[ZeroAblate(Site(1, "resid_post", feature=feature))])
