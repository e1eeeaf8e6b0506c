"""Patching on Ray workers gives the in-process rows: the residual stream (its own chunked job) and heads (the
sweep engine's resample path), with an alignment too."""

import pytest
from distributed_helpers import TEST_CPUS
from numerics import TINY

from resid.analyses import Execution, patching
from resid.analyses.distributed import RayExecutor

CLEAN = ["When Mary and John went to the store, John gave a drink to",
         "The cat and the dog sat on the mat, the cat looked at"]
CORRUPT = ["When Mary and John went to the store, Mary gave a drink to",
           "The cat and the dog sat on the old mat, the dog looked at"]  # one token longer
TARGETS, BASELINES = [" Mary", " the"], [" John", " a"]


@pytest.mark.parametrize("sites", ["resid_pre", "head"])
def test_patching_on_two_workers_equals_in_process(ray_cluster, saved_llama, sites):
    model = saved_llama
    options = dict(sites=sites, align="end" if sites == "resid_pre" else None)
    clean, corrupt = (CLEAN, CORRUPT) if sites == "resid_pre" else (CLEAN[:1] * 2, CORRUPT[:1] * 2)
    expected = patching.activation(model, clean, corrupt, TARGETS, BASELINES, **options,
                                   execution=Execution(batch_size=1))
    with RayExecutor(workers=2, cpus=TEST_CPUS) as executor:
        got = patching.activation(model, clean, corrupt, TARGETS, BASELINES, **options,
                                  execution=Execution(executor=executor, batch_size=1))
    assert list(got["site"]) == list(expected["site"]) and list(got["prompt_idx"]) == list(expected["prompt_idx"])
    assert got["patched_metric"].to_numpy() == pytest.approx(expected["patched_metric"].to_numpy(), abs=TINY["atol"])


@pytest.mark.slow  # the CLI on a fresh Ray pool (test_ray_executor checks the CLI path on Ray in make test)
def test_patch_cli_on_ray_writes_the_in_process_results(saved_llama, ray_cluster, tmp_path, capsys):
    import json

    import pandas as pd

    from resid.analyses.cli.main import main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"clean": CLEAN[0], "corrupt": CORRUPT[0], "target": TARGETS[0],
                                 "baseline": BASELINES[0]}) + "\n")
    common = ["patch", "--model", saved_llama.name, "--pairs", str(pairs), "--sites", "head"]
    assert main([*common, "--out", str(tmp_path / "local.parquet")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray.parquet"), "--ray", "--workers", "2"]) == 0
    local, on_ray = (pd.read_parquet(tmp_path / f"{name}.parquet").sort_values("site", ignore_index=True)
                     for name in ("local", "ray"))
    pd.testing.assert_frame_equal(on_ray, local, check_exact=False, **TINY)
    # attribution patching runs on the same driver: on Ray workers too
    assert main([*common, "--out", str(tmp_path / "atp.parquet"), "--method", "atp"]) == 0
    on_two = ["--out", str(tmp_path / "atp_ray.parquet"), "--method", "atp", "--ray", "--workers", "2"]
    assert main([*common, *on_two]) == 0
    local, on_ray = (pd.read_parquet(tmp_path / f"{name}.parquet").sort_values("site", ignore_index=True)
                     for name in ("atp", "atp_ray"))
    pd.testing.assert_frame_equal(on_ray, local, check_exact=False, **TINY)
