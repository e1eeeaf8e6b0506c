"""What an ablated write is replaced with: nothing (zero), its mean over reference text, or its value on
another prompt (resample).

A "unit" is what one Site edits: a sublayer write `out` [batch pos d_model], a head's `z` [batch pos d_head],
a neuron's coefficient `post` [batch pos], or in a mixture of experts an expert's write `expert_out[:, :, e]`
[batch pos d_model] or an expert neuron's `post[:, :, e, i]` [batch pos] (zero, and averaged as zero, at tokens
not routed to the expert). Means come in two kinds:
- "agnostic" (default): one vector per unit, averaged over every real token of the reference texts;
- "per_position": one vector per position id (0 = first real token), so a prompt's position p is replaced
  by the reference mean at p; the reference texts must reach every position the prompts use.
Reference texts are cut to the longest prompt's token count, so both kinds see the same positions (the means
themselves are a reduction over chunks of texts on any executor: resid.analyses.ablation.means).
"""

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from resid.analyses.io import texts as text_files
from resid.capture import Capture
from resid.errors import ResidError
from resid.interventions import Site

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
    """Reference texts: a list of strings, or a .txt / .jsonl file read by the rules of `resid.analyses.io.texts`
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
