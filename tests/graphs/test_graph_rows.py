"""The graph's backward sweeps as a Job (resid.analyses.graphs.rows), without Ray: the job's own path (setup from the
model, then one sweep per chunk, what a Ray worker runs) gives the rows of the driver's in-process drive (which
sets nothing up: its state is the driver's own, and never pickled); a worker
sets up once per graph, however many rounds of maps it serves; a worker that finds other active features than the
driver is refused; an Execution with an out is refused, naming what to drop (tests/distributed/test_ray_graphs.py
runs graphs on 2 Ray workers)."""

import dataclasses
import pickle

import pytest
import torch
from random_models import make_random_model
from random_transcoders import cross_layer, per_layer

import resid
from resid.analyses import Execution, graphs
from resid.analyses.distributed import InProcess
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.worker import Worker
from resid.analyses.graphs import rows as graph_rows
from resid.analyses.graphs.attribute import logit_vectors
from resid.analyses.graphs.edges import Sweeper
from resid.analyses.graphs.replacement import replace
from resid.analyses.graphs.rows import Batch, RowJob, RowSweeps, feature_batches

IDS = [11, 5, 7, 2, 9, 31, 3]


@pytest.fixture(scope="module", params=["per_layer", "clt"])
def built(request):
    model = make_random_model("llama_gqa")
    transcoders = per_layer(model) if request.param == "per_layer" else cross_layer(model)
    rep = replace(model, IDS, transcoders)
    return model, transcoders, rep


def _batches(model, rep) -> list[Batch]:
    logits = Batch(logits=logit_vectors(model, torch.tensor([3, 8, 1])))
    some = torch.randperm(len(rep.features), generator=torch.Generator().manual_seed(0))[:24]  # any layers, any order
    return [logits, *feature_batches(some, 5)]


def test_the_jobs_own_path_gives_the_in_process_rows(built, monkeypatch) -> None:
    model, _, rep = built
    batches = _batches(model, rep)
    setups = []
    monkeypatch.setattr(graph_rows, "replace", lambda *args, **kwargs: setups.append(1) or replace(*args, **kwargs))
    direct = RowSweeps(model, rep, Sweeper(rep), Execution()).all(batches)  # the driver's own state serves them
    assert setups == []
    through_job: list = [None] * len(batches)  # set up from the model, as a worker does
    job = dataclasses.replace(RowJob.of(model, rep), batches=batches)
    drive(model, job, Execution(executor=InProcess()),
          take=lambda chunk, found: through_job.__setitem__(chunk[0], found))
    assert setups == [1] and pickle.loads(pickle.dumps(RowJob.of(model, rep, local=(rep, None)))).local is None
    assert len(batches) > 3 and [len(b) for b in batches] == [len(rows) for rows in direct]
    for a, b in zip(through_job, direct, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    options = dict(max_feature_nodes=4, max_n_logits=2)  # executor="inprocess" is the driver's own loop, as None
    graph = graphs.attribute(model, IDS, built[1], **options, execution=Execution(executor="inprocess"))
    assert torch.equal(graph.rows, graphs.attribute(model, IDS, built[1], **options).rows)


def test_a_worker_sets_up_once_per_graph_however_many_maps(built, monkeypatch) -> None:
    model, _, rep = built
    setups = []
    original = RowJob.setup
    monkeypatch.setattr(RowJob, "setup", lambda job, m: setups.append(job.session) or original(job, m))
    worker = Worker.__new__(Worker)  # the actor's body, its model given rather than loaded from an origin
    worker.model, worker.job_key, worker.job, worker.state = model, None, None, None
    job = RowJob.of(model, rep)
    batches = _batches(model, rep)
    for key, batch in zip(["map1", "map2", "map3"], batches):  # each round is another map, the same session
        worker.run(key, job, (0, batch))
        worker.run(key, None, (1, batches[-1]))
    assert setups == [job.session]
    other = RowJob.of(model, rep)  # the next graph
    worker.run("map4", other, (0, batches[0]))
    assert setups == [job.session, other.session] and job.session != other.session


def test_a_worker_that_finds_other_features_is_refused(built) -> None:
    model, _, rep = built
    job = RowJob.of(model, rep)
    job.features = job.features[1:]
    with pytest.raises(resid.ResidError, match=r"A worker's replacement run of random-llama_gqa finds \d+ active "
                                               r"features, the driver's \d+ \(first difference: layers\[0\]\.mlp"
                                               r".*Build this graph in process \(leave executor= unset\)"):
        job.setup(model)


def test_an_out_is_refused_with_what_to_drop(built) -> None:
    model, transcoders, _ = built
    with pytest.raises(resid.ResidError, match=r"An attribution graph is one object.*drop out\."):
        graphs.attribute(model, IDS, transcoders, execution=Execution(out="graph.parquet"))
