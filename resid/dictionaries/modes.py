"""How a dictionary takes part in a run: observed (the model runs unchanged) or spliced (the tensor it reconstructs
is replaced inside the pass); resid.dictionaries.attach applies them.

    model.run(prompts, dictionaries=[sae, Observe(sae2, storage="dense"), Splice(transcoder), Splice(d, error=False)])
"""

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.dictionary import Dictionary
from resid.dictionaries.encoded import Storage


@dataclass(frozen=True)
class Observe:
    """Apply `dictionary` to the run without changing it (what a bare Dictionary in the list means)."""

    dictionary: Dictionary | CrossLayerTranscoder
    storage: Storage = "auto"  # feature activations: "auto" (sparse when mostly zero), "sparse" or "dense"


@dataclass(frozen=True)
class Splice:
    """Replace the tensor `dictionary` reconstructs by reconstruction + error (error=False: the reconstruction
    alone), inside the pass. `edit` (fn(acts, tokens) -> acts, [batch pos feature]) changes the activations before
    they are decoded; the error term stays the unedited one."""

    dictionary: Dictionary | CrossLayerTranscoder
    error: bool = True
    storage: Storage = "auto"
    edit: Callable[[Tensor, object], Tensor] | None = None


def unwrapped(items) -> list:
    """The dictionaries of a `dictionaries=` list: an Observe or a Splice gives its dictionary, a bare one itself
    (what analyses read when they take the dictionaries apart, and run them their own way)."""
    return [item.dictionary if isinstance(item, (Observe, Splice)) else item for item in items]
