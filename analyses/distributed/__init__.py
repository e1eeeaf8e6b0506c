"""Chunked work and its executors: sweeps and corpus scans split into deterministic chunks that run in process
(the default) or on Ray workers, one model per worker (one GPU each on GPU clusters).

    execution  Execution: how a long job runs, one value (executor, workers, batch_size, progress, out), and
               Execution.runner, the executor its `executor=` / `workers=` name
    driver     drive(model, job, execution): the one loop that runs every job's chunks
    executor   Job (what a chunk computes), Executor, InProcess
    ray_executor  RayExecutor: actors that load the model once, chunk retry when a worker dies
    worker     the body of one Ray actor
    origin     where a worker loads its model from (what the driver's resid.load was given, checked by identity)
    steps      StepJob, drive_steps: the driver of stateful jobs (training a dictionary or a tuned lens), their
               input made in chunks by the same executors, one checkpoint store, one progress bar

    from resid.analyses.distributed import RayExecutor
    ablation.sweep(model, prompts, targets, execution=Execution(executor="ray", workers=2))  # or RayExecutor(...)
    neurons.top_activating(model, texts, layers=[20],
                           execution=Execution(executor=RayExecutor(workers=2, address="auto")))

Results do not depend on the executor: sweeps write each finished chunk to their ResultStore from the driver
(resumable, each row once), scans merge per-shard top-k lists associatively. Ray is an optional extra,
`pip install 'resid-stream[distributed]'`, imported only when a RayExecutor is made.
"""

from resid.analyses.distributed.executor import Executor, InProcess, Job
from resid.analyses.distributed.ray_executor import RayExecutor

__all__ = ["Executor", "InProcess", "Job", "RayExecutor"]
