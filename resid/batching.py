"""Batching for large sweeps: chunking, an automatic batch size per device, and out-of-memory back-off.

`run_batched(items, work, batch_size)` calls `work(chunk)` on consecutive chunks of `items`. With
batch_size="auto" the first chunk size comes from the device (free CUDA memory, or a token budget on
CPU); a CUDA out-of-memory error halves the size and retries the same chunk, so no item is lost or done
twice. Results come back in order, chunk by chunk, for the caller to persist as they arrive.
"""

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch
from tqdm.auto import tqdm

from resid.errors import ResidError

Item = TypeVar("Item")
Result = TypeVar("Result")

CPU_TOKENS_PER_BATCH = 4096  # large enough to amortize Python overhead, small enough to stay in cache-friendly sizes
MAX_BATCH = 1024


def auto_batch_size(
    device: torch.device, n_pos: int, d_model: int, d_mlp: int, n_heads: int, d_vocab: int, bytes_per_value: int
) -> int:
    """A first guess at rows per forward pass; OOM back-off corrects it on CUDA."""
    n_pos = max(n_pos, 1)
    if device.type != "cuda":
        return max(1, min(MAX_BATCH, CPU_TOKENS_PER_BATCH // n_pos))
    free, _ = torch.cuda.mem_get_info(device)
    # Working set of one row: residual-width activations, the MLP hidden, attention scores, one logit row.
    per_row = bytes_per_value * (n_pos * (8 * d_model + 4 * d_mlp + 2 * n_heads * n_pos) + 2 * d_vocab)
    return max(1, min(MAX_BATCH, int(0.5 * free // per_row)))


def run_batched(
    items: Sequence[Item],
    work: Callable[[Sequence[Item]], Result],
    batch_size: int,
    progress: bool = True,
    description: str = "",
) -> Iterator[tuple[Sequence[Item], Result]]:
    """Yield (chunk, work(chunk)) over `items` in order, halving the chunk size on CUDA out-of-memory."""
    if batch_size < 1:
        raise ResidError(f"batch_size must be a positive integer or 'auto', got {batch_size}.")
    bar = tqdm(total=len(items), desc=description, disable=not progress, leave=False)
    start = 0
    try:
        while start < len(items):
            chunk = items[start : start + batch_size]
            try:
                result = work(chunk)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                if batch_size == 1:
                    raise ResidError(
                        "Out of GPU memory even with a batch of one row: use shorter prompts, a smaller model, "
                        "dtype=torch.bfloat16, or run on the CPU (device='cpu')."
                    ) from None
                batch_size = max(1, batch_size // 2)
                continue
            start += len(chunk)
            bar.update(len(chunk))
            yield chunk, result
    finally:
        bar.close()
