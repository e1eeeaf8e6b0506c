"""What an ablated write is replaced with: nothing (zero), its mean over reference text, or its value on
another prompt (resample).

A "unit" is what one Site edits: a sublayer write `out` [batch pos d_model], a head's `z` [batch pos d_head],
a neuron's coefficient `post` [batch pos], or in a mixture of experts an expert's write `expert_out[:, :, e]`
[batch pos d_model] or an expert neuron's `post[:, :, e, i]` [batch pos] (zero, and averaged as zero, at tokens
not routed to the expert). Means come in two kinds:
- "agnostic" (default): one vector per unit, averaged over every real token of the reference texts;
- "per_position": one vector per position id (0 = first real token), so a prompt's position p is replaced
  by the reference mean at p; the reference texts must reach every position the prompts use.
Reference texts are cut to the longest prompt's token count, so both kinds see the same positions.
"""

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from analyses.io import texts as text_files
from resid.capture import Capture
from resid.errors import ResidError
from resid.interventions import Site
from resid.model import Transformer
from resid.tokenizer import Tokens

Unit = tuple[int, str, int | None, int | None, int | None, str | None]  # (layer, part, head, neuron, expert,
# input): a Site without its positions


def unit_of(site: Site) -> Unit:
    """The value a site edits, whatever its positions (means and donors are read per unit)."""
    return (site.layer, site.part, site.head, site.neuron, site.expert, site.input)


def capture_for(units: Iterable[Unit]) -> Capture:
    """The smallest Capture that records every unit (plus the residual writes)."""
    units = list(units)
    attn, mlp = {"out"}, {"out"}
    attn |= {"z"} if any(u[1] == "attn" and u[2] is not None and u[5] is None for u in units) else set()
    attn |= {u[5] for u in units if u[5] is not None}  # a head's q, k or v
    mlp |= {"post"} if any(u[1] == "mlp" and u[3] is not None for u in units) else set()
    mlp |= {"expert_out"} if any(u[4] is not None and u[3] is None for u in units) else set()
    return Capture(attn=attn, mlp=mlp)


def read_unit(stream, unit: Unit) -> Tensor:
    """The unit's clean value from a stream: [batch pos d_model], [batch pos d_head], [batch pos] or, for an
    attention pattern, [batch pos key_pos]."""
    layer, part, head, neuron, expert, head_input = unit
    record = getattr(stream.layers[layer], part)
    if head_input == "pattern":  # [batch head pos key_pos]
        return record.pattern[:, head]
    if head_input is not None:
        return getattr(record, head_input)[:, :, head]
    if head is not None:
        return record.z[:, :, head]
    if expert is not None:
        return record.expert_out[:, :, expert] if neuron is None else record.post[:, :, expert, neuron]
    if neuron is not None:
        return record.post[:, :, neuron]
    return record.out


def read_reference(reference: Sequence[str] | str | Path) -> list[str]:
    """Reference texts: a list of strings, or a .txt / .jsonl file read by the rules of `analyses.io.texts`
    (the ones `--corpus` follows). Blank texts are dropped."""
    if isinstance(reference, (str, Path)):
        if not Path(reference).is_file():
            raise ResidError(f"reference {str(reference)!r} is not a file; pass a list of texts or a path to a .txt "
                             "or .jsonl file.")
        texts = [t for t in text_files.read(reference, "reference") if t.strip()]
        if not texts:
            raise ResidError(f"The reference file {reference} has no non-blank texts.")
        return texts
    texts = [t for t in reference if isinstance(t, str) and t.strip()]
    if not texts:
        raise ResidError("The reference texts are empty: give at least one non-empty text.")
    return texts


def reference_tokens(model: Transformer, texts: list[str], max_tokens: int, batch: int) -> Iterable[Tokens]:
    """Right-padded batches of the texts, each cut to its first `max_tokens` tokens."""
    tokenizer = model.require_tokenizer()
    encoded = [ids[:max_tokens] for ids in (tokenizer.encode(t) for t in texts) if ids]
    for start in range(0, len(encoded), batch):
        yield Tokens.pad(encoded[start : start + batch], tokenizer.pad_token_id, "right")


def reference_means(
    model: Transformer, units: list[Unit], batches: Iterable[Tokens], per_position: bool, n_positions: int
) -> dict[Unit, Tensor]:
    """Streaming means of each unit over the real tokens of the reference batches (nothing else is kept).
    Agnostic: {unit: [dim...]}; per position: {unit: [n_positions dim...]}."""
    patterns = [u for u in units if u[5] == "pattern"]
    if patterns:
        layer, part, head = patterns[0][:3]
        raise ResidError(f"Attention patterns have no mean over reference texts (their key axis is each text's own "
                         f"length): layers[{layer}].{part} head {head} pattern. Ablate patterns with method='zero' or "
                         "'resample'.")
    sums: dict[Unit, Tensor] = {}
    counts = torch.zeros(n_positions if per_position else 1, dtype=torch.float64)
    capture = capture_for(units)
    for tokens in batches:
        tokens = tokens.to(model.device)
        stream = model.run(tokens, capture=capture, logits_at="last").stream
        mask = tokens.attention_mask
        slot = tokens.position_ids[mask] if per_position else torch.zeros(int(mask.sum()), dtype=torch.long)
        counts += torch.bincount(slot.cpu(), minlength=counts.shape[0])[: counts.shape[0]].double()
        for unit in units:
            values = read_unit(stream, unit)[mask].double()  # [tokens dim...]
            total = sums.setdefault(unit, torch.zeros((counts.shape[0], *values.shape[1:]), dtype=torch.float64))
            total.index_add_(0, slot.cpu(), values.cpu())
    if counts.sum() == 0:
        raise ResidError("The reference texts gave no tokens to average over.")
    if per_position and (counts == 0).any():
        first = int((counts == 0).nonzero()[0])
        raise ResidError(
            f"Per-position means need reference texts at least as long as the prompts ({n_positions} tokens); "
            f"no reference text reaches position {first}. Add longer texts or use position-agnostic means."
        )
    shape = (-1,) + (1,) * (next(iter(sums.values())).ndim - 1) if sums else (-1,)
    means = {unit: (total / counts.view(shape)).to(model.dtype).to(model.device) for unit, total in sums.items()}
    return means if per_position else {unit: mean[0] for unit, mean in means.items()}


def random_donors(lengths: Sequence[int], seed: int) -> list[int]:
    """For each prompt, another prompt of the same token length, drawn with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    donors = []
    for i, length in enumerate(lengths):
        candidates = [j for j, other in enumerate(lengths) if j != i and other == length]
        if not candidates:
            raise ResidError(
                f"Resample ablation needs, for prompt {i} ({length} tokens), another prompt with the same number "
                "of tokens to take writes from; none has. Use prompts of equal token length, or pass the donor "
                "prompts explicitly with reference=[...] (one per prompt)."
            )
        donors.append(candidates[int(torch.randint(len(candidates), (1,), generator=generator))])
    return donors
