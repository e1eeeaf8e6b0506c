"""Run inside an environment with the `decode-clt` package (PyPI; curt-tigges/crosslayer-coding), never resid's:
its CrossLayerTranscoder's training step (as its CLTTrainer runs one: feature activations, LossManager's total loss,
backward, AdamW) on synthetic batches of the shapes benchmarks/bench_clt.py gives as JSON, BatchTopK selected over
all layers' features (k x layers per token: its per-layer mode does not encode BatchTopK in 0.0.1), with the
library's default loss terms. Prints one JSON line: the median seconds per step after one warm-up step."""

import json
import statistics
import sys
import time
from importlib.metadata import version

import torch
from clt.config import CLTConfig, TrainingConfig
from clt.models.clt import CrossLayerTranscoder
from clt.training.losses import LossManager


def main() -> None:
    shape = json.loads(sys.argv[1])
    torch.set_num_threads(shape["threads"])
    n, d, b, steps = shape["layers"], shape["d_model"], shape["batch_size"], shape["steps"]
    # its per-layer mode ("per_layer") encodes BatchTopK as zeros in 0.0.1 (its encode() accepts only jumprelu and
    # relu), so the selection is its global one, over every layer's features: k x layers entries per token
    config = CLTConfig(num_features=shape["features"], num_layers=n, d_model=d, activation_fn="batchtopk",
                       batchtopk_k=shape["k"] * n)
    training = TrainingConfig(learning_rate=1e-4, training_steps=steps + 1, normalization_method="none",
                              activation_path="unused")  # the batches are made here, not read from a store
    model = CrossLayerTranscoder(config, process_group=None, device=torch.device("cpu"))
    losses = LossManager(training, clt_config=config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.learning_rate)
    g = torch.Generator().manual_seed(0)
    inputs = {layer: torch.randn(b, d, generator=g) for layer in range(n)}
    targets = {layer: torch.randn(b, d, generator=g) for layer in range(n)}
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        acts = model.get_feature_activations(inputs)
        loss, _ = losses.compute_total_loss(model, inputs, targets, step, steps + 1, precomputed_activations=acts)
        loss.backward()
        optimizer.step()
        model.decoder_module._cached_decoder_norms = None  # as its trainer does after each step
        times.append(time.perf_counter() - start)
    print(json.dumps({"version": version("decode-clt"), "activation": f"batchtopk over all layers, k={shape['k'] * n}",
                      "seconds": statistics.median(times[1:])}))


if __name__ == "__main__":
    main()
