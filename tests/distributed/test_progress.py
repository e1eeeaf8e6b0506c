"""A long job says it is working on any stream (resid.analyses.distributed.progress): where no bar is drawn (stderr
is not a terminal) and progress was not turned off, a line every LINE_EVERY seconds with the share done and the time
left, and a last line when it is done; progress=False prints nothing; a job shorter than LINE_EVERY prints nothing."""

import re

import pytest
import torch
from random_models import make_random_model

from resid.analyses import Execution, ablation
from resid.analyses.distributed import progress
from resid.analyses.distributed.progress import Lines

IDS = torch.tensor([[5, 17, 3, 9, 22, 41], [7, 7, 12, 30, 8, 2]])


@pytest.fixture(scope="module")
def model():
    return make_random_model("llama_gqa")


def test_a_sweep_writing_to_a_captured_stream_says_what_it_did(model, monkeypatch, capsys) -> None:
    monkeypatch.setattr(progress, "LINE_EVERY", 0.0)  # a line at every update: the sweep is milliseconds long
    ablation.sweep(model, IDS, [3, 4], sites="sublayer", execution=Execution(batch_size=2))
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and all(line.startswith("sites (1 chunks): ") for line in lines), lines
    assert re.search(r": \d+/12 rows \(\d+%\), \d+ s so far", lines[0]), lines
    assert re.search(r": done, 12 rows in \d+ s$", lines[-1]), lines


def test_progress_false_and_short_jobs_print_nothing(model, monkeypatch, capsys) -> None:
    ablation.sweep(model, IDS, [3, 4], sites="sublayer")  # default LINE_EVERY: far longer than this job
    monkeypatch.setattr(progress, "LINE_EVERY", 0.0)
    ablation.sweep(model, IDS, [3, 4], sites="sublayer", execution=Execution(progress=False))
    assert capsys.readouterr().err == ""


def test_a_line_estimates_the_time_left_from_the_rate_so_far(monkeypatch, capsys) -> None:
    clock = iter([0.0, 40.0, 80.0, 90.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with Lines(total=100, desc="patching", unit="row") as bar:
        bar.update(20)  # 20 rows in 40 s: 80 left at that rate
        bar.set_postfix({"loss": 0.312345})
        bar.update(20)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "patching: 20/100 rows (20%), 40 s so far, about 2 min 40 s left", err
    assert err[1] == "patching: 40/100 rows (40%), 80 s so far, about 2 min 00 s left; loss=0.3123", err
    assert err[2] == "patching: done, 40 rows in 90 s"


def test_an_attribution_graph_and_its_head_split_report_their_sweeps(model, monkeypatch, capsys) -> None:
    """graphs.attribute and split_heads run their backward sweeps on the driver, so their progress reaches the caller:
    one line per batch of targets, counting every target (each feature and logit node; each target node of the
    split), and progress=False silences both."""
    from random_transcoders import per_layer

    from resid.analyses import graphs

    monkeypatch.setattr(progress, "LINE_EVERY", 0.0)
    transcoders, ids = per_layer(model), [11, 5, 7, 2, 9, 31, 3]
    graph = graphs.attribute(model, ids, transcoders, max_n_logits=3, execution=Execution(batch_size=16))
    lines = capsys.readouterr().err.strip().splitlines()
    n_targets = graph.n_features + graph.n_logits
    chunks = -(-graph.n_features // 16) + 1  # the feature batches and one of the logits
    assert re.fullmatch(rf"graph rows \({chunks} chunks\): done, {n_targets} targets in \d+ s", lines[-1]), lines
    assert len(lines) == chunks + 1 and all(line.startswith(f"graph rows ({chunks} chunks): ") for line in lines)

    pruned = graph.pruned(0.8, 0.98)
    split = graphs.split_heads(model, pruned, transcoders, execution=Execution(batch_size=4))
    lines = capsys.readouterr().err.strip().splitlines()
    n_targets = len(split.targets.unique())
    assert re.fullmatch(rf"head split \(\d+ chunks\): done, {n_targets} targets in \d+ s", lines[-1]), lines
    assert len(lines) == -(-n_targets // 4) + 1, lines

    graphs.attribute(model, ids, transcoders, max_n_logits=3, execution=Execution(batch_size=16, progress=False))
    graphs.split_heads(model, pruned, transcoders, execution=Execution(batch_size=4, progress=False))
    assert capsys.readouterr().err == ""
