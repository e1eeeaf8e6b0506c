"""Batching: chunks in order, out-of-memory back-off that neither loses nor repeats work."""

import pytest
import torch
from random_models import make_random_model

import resid
from resid import batching
from resid.analyses import Execution, ablation
from resid.batching import BatchSize, available_bytes, cuda_free_bytes, model_batch_size, run_batched


def test_run_batched_halves_on_out_of_memory_and_keeps_order():
    calls = []

    def work(chunk):
        calls.append(list(chunk))
        if len(chunk) > 3:
            raise torch.cuda.OutOfMemoryError("simulated")
        return [x * 10 for x in chunk]

    size = BatchSize(16)
    results = list(run_batched(list(range(11)), work, size))
    assert [x for chunk, _ in results for x in chunk] == list(range(11))
    assert [y for _, out in results for y in out] == [x * 10 for x in range(11)]
    assert size.value == 2  # 16 -> 8 -> 4 -> 2 and it stays there
    assert calls[:3] == [list(range(11)), list(range(8)), list(range(4))]


def test_batch_size_one_out_of_memory_is_a_clear_error():
    def work(chunk):
        raise torch.cuda.OutOfMemoryError("simulated")

    with pytest.raises(resid.ResidError, match="Out of GPU memory even with a batch of one row"):
        list(run_batched([1, 2], work, BatchSize(2)))
    with pytest.raises(resid.ResidError, match="positive integer"):
        BatchSize(0)


def test_auto_batch_size_on_cpu(random_model):
    assert model_batch_size(random_model, 64) == 64
    assert model_batch_size(random_model, 100_000) == 1
    assert model_batch_size(random_model, 64, kept_bytes_per_row=10**13) == 1  # what a caller keeps bounds it


def test_cpu_batches_take_at_most_half_the_available_memory(random_model, monkeypatch):
    """A forward row's working set (eager scores included) against half of what the host has left; a
    differentiated pass keeps every layer's, so it takes n_layers times as much (AtP's batches)."""
    cfg, n_pos = random_model.config, 64
    layer = n_pos * (8 * cfg.d_model + 4 * cfg.d_mlp + 2 * cfg.n_heads * n_pos)
    forward = 4 * (layer + 2 * cfg.d_vocab)
    backward = 4 * (cfg.n_layers * layer + 2 * cfg.d_vocab)
    monkeypatch.setattr(batching, "host_available_bytes", lambda: 2 * 10 * forward)
    assert model_batch_size(random_model, n_pos) == 10
    assert model_batch_size(random_model, n_pos, backward=True) == 10 * forward // backward
    monkeypatch.setattr(batching, "host_available_bytes", lambda: 0)
    assert model_batch_size(random_model, n_pos) == 1  # one row still runs (the estimate is an upper bound)


def test_sweep_survives_out_of_memory(random_model, monkeypatch):
    prompts = ["The quick brown fox jumps", "A slow green turtle walks", "One two three four five"]
    expected = ablation.sweep(random_model, prompts, " over", sites="sublayer", execution=Execution(batch_size=1))
    real_resume = random_model.resume

    def small_memory_resume(layer, resid_pre, *args, **kwargs):
        if resid_pre.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("simulated")
        return real_resume(layer, resid_pre, *args, **kwargs)

    monkeypatch.setattr(random_model, "resume", small_memory_resume)
    got = ablation.sweep(random_model, prompts, " over", sites="sublayer", execution=Execution(batch_size=8))
    assert len(got) == len(expected) == 3 * 2 * random_model.config.n_layers
    torch.testing.assert_close(torch.tensor(got.ablated_metric.to_numpy()),
                               torch.tensor(expected.ablated_metric.to_numpy()), atol=1e-5, rtol=1e-5)


def test_sweep_on_cuda_matches_cpu(random_model, gpu):
    prompts = ["The quick brown fox jumps", "A slow green turtle walks"]
    cpu = ablation.sweep(random_model, prompts, " over", sites="head", method="resample",
                         reference=prompts[::-1])
    on_gpu = ablation.sweep(random_model.to(gpu), prompts, " over", sites="head", method="resample",
                            reference=prompts[::-1])
    torch.testing.assert_close(torch.tensor(on_gpu.ablated_metric.to_numpy()),
                               torch.tensor(cpu.ablated_metric.to_numpy()), atol=1e-4, rtol=1e-4)


def test_cuda_out_of_memory_backs_off_to_the_rows_of_a_small_batch(gpu):
    """A real out-of-memory error: a sweep asked to run, in one batch, more rows than the GPU's free memory holds
    (by the forward's own working set), finishes with the rows of a small-batch run."""
    if gpu.type != "cuda":
        pytest.skip("an out-of-memory error needs a CUDA GPU")
    model = make_random_model("llama_gqa", n_layers=2, d_model=256, d_head=64, d_mlp=8192, n_ctx=1024).to(gpu)
    free, _ = torch.cuda.mem_get_info(gpu)
    n_pos = model.config.n_ctx
    # one MLP hidden alone is 4 * d_mlp bytes per token in float32: rows enough that one batch needs 2x free memory
    rows = int(2 * free // (4 * model.config.d_mlp * n_pos)) + 1
    if rows > 20_000:
        pytest.skip(f"{free / 2**30:.0f} GiB free: too many rows for a quick test")
    ids = torch.randint(0, model.config.d_vocab, (rows, n_pos), generator=torch.Generator().manual_seed(0))
    site = [resid.Site(model.config.n_layers - 1, "mlp")]
    one_batch = ablation.sweep(model, ids, 3, sites=site, execution=Execution(batch_size=rows))
    small = ablation.sweep(model, ids[:64], 3, sites=site, execution=Execution(batch_size=8))
    assert len(one_batch) == rows
    first = one_batch.sort_values("prompt_idx").ablated_metric.to_numpy()[:64]
    torch.testing.assert_close(torch.tensor(first), torch.tensor(small.sort_values("prompt_idx").ablated_metric
                                                                 .to_numpy()), atol=1e-5, rtol=1e-4)


def test_free_cuda_memory_counts_what_the_allocator_keeps(monkeypatch):
    """Memory PyTorch's caching allocator keeps after a tensor is freed is free for the next one, though the driver
    counts it as taken (a training run after a sweep was refused "1.4 GiB free" on a 141 GB GPU): reserved but
    unallocated bytes are added to the driver's free memory."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 40 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 << 30)
    assert cuda_free_bytes(torch.device("cuda")) == 39 << 30
    assert available_bytes(torch.device("cuda")) == 39 << 30


def test_free_cuda_memory_after_a_freed_tensor(gpu):
    if gpu.type != "cuda":
        pytest.skip("the caching allocator is CUDA's")
    size = cuda_free_bytes(gpu) // 4
    block = torch.empty(size, dtype=torch.uint8, device=gpu)
    del block
    assert cuda_free_bytes(gpu) - torch.cuda.mem_get_info(gpu)[0] >= size
