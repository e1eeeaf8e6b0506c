"""The body of one Ray actor: it loads the model once from its origin, then runs chunks of any job.

Imported by Ray in the worker process. Nothing here imports ray (RayExecutor wraps the class with `ray.remote`
and sends the job, as plain data, with each actor's first chunk of it), so the base install can import it.
What a worker sends back holds its tensors on the CPU: the driver may have no GPU, or another one, and puts them
where it needs them.
"""

import torch

from resid.analyses.distributed.executor import Job
from resid.analyses.distributed.origin import ModelOrigin, load


class Worker:
    def __init__(self, origin: ModelOrigin, threads: int):
        # One intra-op thread per worker by default: N workers on N cores, none oversubscribed.
        torch.set_num_threads(threads)
        # Ray hides the GPUs an actor was not given (CUDA_VISIBLE_DEVICES), so "cuda" is this actor's own GPU.
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = load(origin, device)
        self.job_key: str | None = None
        self.job: Job | None = None
        self.state: object = None

    def ready(self) -> str:
        """The device the model sits on (called once, so that a failed load surfaces at start-up)."""
        return str(self.model.device)

    def run(self, key: str, job: Job | None, chunk: object) -> object:
        """One chunk's combined result. The job comes with the first chunk of each job only (None after that);
        its state is kept for the chunks that follow, and for later maps of a job of the same `session`."""
        if key != self.job_key:
            assert job is not None, "RayExecutor sends the job with each actor's first chunk of it"
            if job.session is None or self.job is None or job.session != self.job.session:
                self.state = job.setup(self.model)
            self.job, self.job_key = job, key
        return on_cpu(self.job.combine(list(self.job.run(self.state, chunk))))


def on_cpu(value: object) -> object:
    """`value` with every tensor in it (in dicts, lists and tuples, at any depth) moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: on_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_cpu(item) for item in value)
    return value
