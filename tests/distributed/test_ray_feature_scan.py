"""A feature scan on a local Ray cluster gives the in-process table for 1 and 2 workers (activations to float32
rounding, the same tokens except where activations tie to that rounding) and the same histograms, with SAELens
fixtures (an SAE on the residual and a transcoder from the MLP's standardized input) on the tiny Llama."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from distributed_helpers import RAY_REASON, TEST_CPUS, TEXTS
from numerics import TINY

import resid.dictionaries
from resid.analyses import Execution, features
from resid.analyses.distributed import RayExecutor

ray = pytest.importorskip("ray", reason=RAY_REASON)
DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"


def test_feature_scan_is_the_same_for_1_and_2_workers(saved_llama, ray_cluster):
    found = [resid.dictionaries.load(DATA / "saelens" / name, saved_llama) for name in ("standard", "transcoder")]
    options = dict(k=4, window=9)  # batches of 2: 14 shards of 8 windows
    expected = features.top_activating(saved_llama, found, TEXTS, **options, execution=Execution(batch_size=2))
    assert len(expected) > 50 and expected["site"].str.contains("feature").all()
    for workers in (1, 2):
        with RayExecutor(workers=workers, cpus=TEST_CPUS) as executor:
            table = features.top_activating(saved_llama, found, TEXTS, **options,
                                            execution=Execution(executor=executor, batch_size=2))
        _same_up_to_near_ties(table, expected)
        pd.testing.assert_frame_equal(table.attrs["histogram"], expected.attrs["histogram"])


def _same_up_to_near_ties(table: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Equal activations rank by rank (to float32 rounding); a rank may be held by another token only where that
    activation ties, to that rounding, with another rank of the same feature or is the last rank."""
    columns = ["dictionary", "site", "feature", "rank", "activation"]
    pd.testing.assert_frame_equal(table[columns], expected[columns], check_exact=False, **TINY)
    same = (table[["doc", "pos"]].to_numpy() == expected[["doc", "pos"]].to_numpy()).all(axis=1)
    k = expected["rank"].max()
    for i in np.flatnonzero(~same):
        row = expected.iloc[i]
        group = expected[expected["site"] == row["site"]]
        others = group[group["rank"] != row["rank"]]["activation"].to_numpy()
        tied = np.isclose(others, row.activation, atol=TINY["atol"], rtol=TINY["rtol"]).any()
        assert tied or row["rank"] == k, f"rank {row['rank']} of {row['site']} differs without a tie"
