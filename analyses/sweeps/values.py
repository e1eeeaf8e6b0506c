"""What an ablated site is replaced with: nothing (zero), its mean over reference text, or its value on
another prompt (resample).

Means and donor values are read per site over every position (`site.whole`): a residual [batch pos d_model], a
sublayer write, a head's `z` [batch pos d_head], a neuron's coefficient `post` [batch pos], or in a mixture of
experts an expert's write `expert_out[:, :, e]` [batch pos d_model] or an expert neuron's `post[:, :, e, i]`
[batch pos] (zero, and averaged as zero, at tokens not routed to the expert). Means come in two kinds:
- "agnostic" (default): one vector per unit, averaged over every real token of the reference texts;
- "per_position": one vector per position id (0 = first real token), so a prompt's position p is replaced
  by the reference mean at p; the reference texts must reach every position the prompts use.
Reference texts are cut to the longest prompt's token count, so both kinds see the same positions (the means
themselves are a reduction over chunks of texts on any executor: resid.analyses.sweeps.means).
"""

from collections.abc import Sequence
from pathlib import Path

import torch

from resid.analyses.io import texts as text_files
from resid.errors import ResidError, param


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
                f"prompts explicitly with {param('reference')} (one donor prompt per prompt, in order)."
            )
        donors.append(candidates[int(torch.randint(len(candidates), (1,), generator=generator))])
    return donors
