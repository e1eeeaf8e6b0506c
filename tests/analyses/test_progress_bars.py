"""Progress bars count the unit of their total, so they show a percentage and an ETA (issue 38): a sweep's bar
counts rows of rows, a patching job's (whose chunks are not sized) whole chunks of chunks, each once."""

import re

import pytest
import torch
from random_models import make_random_model

from resid.analyses import Execution, ablation, patching

IDS = [[5, 9, 2, 7], [3, 1, 8, 4], [6, 6, 2, 1]]


def _last_bar(stderr: str) -> tuple[int, int, str]:
    """(done, total, unit) of the last state the bar drew."""
    found = re.findall(r"(\d+)/(\d+) \[[^\]]*?, *[\d.?]+ *(\w+)/s\]|(\d+)/(\d+) \[[^\]]*?, *[\d.?]+s/(\w+)\]", stderr)
    assert found, stderr
    done, total, unit, *rest = found[-1]
    if not done:
        done, total, unit = rest
    return int(done), int(total), unit


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_sweeps_bar_counts_rows_of_rows(capsys, batch_size):
    model = make_random_model("llama_gqa")
    df = ablation.sweep(model, torch.tensor(IDS), [1, 2, 3], sites="layer",
                        execution=Execution(progress=True, batch_size=batch_size))
    done, total, unit = _last_bar(capsys.readouterr().err)
    assert (done, total, unit) == (len(df), len(df), "row") and len(df) == 3 * model.config.n_layers


def test_a_patching_bar_counts_chunks_of_chunks(capsys, gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    clean = ["When Mary and John went", "When Anna and Paul went", "When Kate and Mark went"]
    corrupt = ["When John and Mary went", "When Paul and Anna went", "When Mark and Kate went"]
    patching.atp(model, clean, corrupt, [" Mary", " Anna", " Kate"], execution=Execution(progress=True, batch_size=1))
    done, total, unit = _last_bar(capsys.readouterr().err)
    assert (done, total, unit) == (3, 3, "chunk")
