"""`resid patch`: the table and heatmap it writes, on SmolLM2 and IOI pairs, equal resid.analyses.patching's."""

import json

import pandas as pd
import pytest

from resid.analyses import patching
from resid.analyses.cli.main import main

pytestmark = pytest.mark.slow  # the real SmolLM2 through the command line

PAIRS = [
    {"clean": "When Mary and John went to the store, John gave a drink to",
     "corrupt": "When Mary and John went to the store, Mary gave a drink to", "target": " Mary", "baseline": " John"},
    {"clean": "When Alice and Bob went to the store, Bob gave a drink to",
     "corrupt": "When Alice and Bob went to the store, Alice gave a drink to", "target": " Alice", "baseline": " Bob"},
]


@pytest.mark.parametrize("method", ["exact", "atp"])
def test_patch_writes_the_table_and_heatmap(tmp_path, capsys, smollm2, method):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    out = tmp_path / "resid.csv"
    assert main(["patch", "--pairs", str(pairs), "--method", method, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "largest mean effects on logit_diff (denoise)" in printed and "resid_pre" in printed
    df = pd.read_csv(out)
    extra = [] if method == "exact" else ["method", "magnitude"]
    assert list(df.columns) == [*patching.COLUMNS, *extra] and len(df) == 2 * 30 * 14
    assert (tmp_path / "resid.html").stat().st_size > 10_000
    if method == "exact":
        expected = patching.activation(smollm2, [p["clean"] for p in PAIRS], [p["corrupt"] for p in PAIRS],
                                       [p["target"] for p in PAIRS], [p["baseline"] for p in PAIRS])
        assert df["patched_metric"].to_numpy() == pytest.approx(expected["patched_metric"].to_numpy(), abs=1e-4)
        s2 = df[(df.layer == 0) & (df.position == 9)]  # the one embedding where the pairs differ: the clean run
        assert s2["score"].to_numpy() == pytest.approx(1.0, abs=1e-4)


def test_patch_atp_star_of_keys(tmp_path, capsys, smollm2):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    out = tmp_path / "keys.parquet"
    assert main(["patch", "--pairs", str(pairs), "--method", "atp*", "--sites", "k", "--out", str(out)]) == 0
    assert "largest estimated effect sizes on logit_diff (AtP* GradDrop, denoise)" in capsys.readouterr().out
    df = pd.read_parquet(out)
    kv_heads = smollm2.config.n_kv_heads
    assert len(df) == 2 * 30 * kv_heads and (df["method"] == "atp*").all()
    assert set(df["site"]) == {f"layers[{l}].attn.kv_head[{h}].k" for l in range(30) for h in range(kv_heads)}
    expected = patching.atp(smollm2, [p["clean"] for p in PAIRS], [p["corrupt"] for p in PAIRS],
                                    [p["target"] for p in PAIRS], [p["baseline"] for p in PAIRS], sites="k",
                                    method="atp*")
    assert df["magnitude"].to_numpy() == pytest.approx(expected["magnitude"].to_numpy(), abs=1e-5)


def test_patch_aligns_pairs_of_different_lengths(tmp_path, smollm2):
    longer = [dict(p, corrupt=p["corrupt"].replace("the store", "the big store")) for p in PAIRS]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in longer) + "\n")
    out = tmp_path / "resid.parquet"
    assert main(["patch", "--pairs", str(pairs), "--method", "atp", "--align", "end", "--out", str(out)]) == 0
    expected = patching.atp(smollm2, [p["clean"] for p in longer], [p["corrupt"] for p in longer],
                                    [p["target"] for p in longer], [p["baseline"] for p in longer],
                                    sites="resid_pre", align="end")
    df = pd.read_parquet(out)
    assert len(df) == 2 * 30 * 14 and list(df["site"]) == list(expected["site"])
    assert df["patched_metric"].to_numpy() == pytest.approx(expected["patched_metric"].to_numpy(), abs=1e-5)
