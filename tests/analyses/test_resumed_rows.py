"""A resumed sweep checks the rows of its store against its job (resid.analyses.distributed.driver): a row of a
prompt or site outside the sweep, a NaN where the sweep stores a finite number, or text in a column of numbers is
refused with one error that says the store does not match and what to do, never merged into the results; an
undamaged store resumes to the same rows."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from random_models import make_random_model

from resid.analyses import Execution, ablation
from resid.errors import ResidError

PROMPTS = torch.tensor([[1, 5, 9, 2, 7], [3, 4, 6, 8, 10]])
TARGETS = [11, 12]


@pytest.fixture(scope="module")
def model():
    return make_random_model("llama_gqa")


def _sweep(model, out: Path) -> pd.DataFrame:
    return ablation.sweep(model, PROMPTS, TARGETS, sites="sublayer", metric="logit", execution=Execution(out=out))


def _edit(out: Path, change) -> None:
    table = pd.read_csv(out)
    change(table)
    table.to_csv(out, index=False)


def _set(column: str, value: object):
    def change(table: pd.DataFrame) -> None:
        table[column] = table[column].astype(object)
        table.loc[1, column] = value
    return change


@pytest.mark.parametrize("change, problem", [
    (_set("delta", np.nan), r"the row of prompt_idx 0, site layers\[0\]\.mlp has delta nan \(this sweep stores "
                            r"finite numbers there\)"),
    (_set("site", "layers[9].attn"), r"1 value\(s\) of its key column 'site' are not this sweep's, e.g. "
                                     r"'layers\[9\]\.attn'"),
    (_set("prompt_idx", 7), r"1 value\(s\) of its key column 'prompt_idx' are not this sweep's, e.g. 7"),
    (_set("clean_metric", "abc"), r"\S*sweep.csv holds text \('abc'\) in its column 'clean_metric', where this "
                                  r"sweep stores numbers \(the file was edited or damaged\)"),
])
def test_a_resumed_store_with_rows_this_sweep_cannot_have_written_is_refused(model, tmp_path, change, problem):
    out = tmp_path / "sweep.csv"
    first = _sweep(model, out)
    pd.testing.assert_frame_equal(_sweep(model, out), first)  # the control: resumed as it was, nothing computed
    _edit(out, change)
    with pytest.raises(ResidError, match=rf"The results stored at {out} do not match this sweep: {problem}\. "
                                         rf"Delete {out}, sweep.csv.sweep.json and sweep.csv.parts \(whichever "
                                         r"exist\) to compute them again, or choose another output path\."):
        _sweep(model, out)


def test_a_non_finite_result_is_not_stored(tmp_path):
    """A NaN the model computes is refused as it arrives, naming the row, so that no store ever holds one (and the
    check on resuming never refuses a store the sweep wrote itself)."""
    out = tmp_path / "sweep.csv"
    broken = make_random_model("llama_gqa")
    with torch.no_grad():
        broken.unembed.weight[TARGETS[0]] = float("nan")  # the first prompt's target logit
    with pytest.raises(ResidError, match=r"sites: the row of prompt_idx 0, site layers\[0\]\.attn has clean_metric "
                                         r"nan, so it is not stored: the model's output is not a finite number there"):
        _sweep(broken, out)
    assert not out.exists()
