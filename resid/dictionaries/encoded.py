"""What a dictionary computed in a run (`run.dictionaries[name]`): its feature activations, its reconstruction and
its error term, at the run's captured positions.

Axes as in resid.dictionaries.dictionary: `feature` the dictionary's features, `d_in` / `d_out` the widths of the
tensors it reads and reconstructs.

Feature activations are mostly zero (a few dozen of 16k features fire on a token), so they are stored as a torch
sparse COO tensor when fewer than a quarter are non-zero ("auto"), or always sparse / always dense on request.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from jaxtyping import Float, Int
from torch import Tensor

from resid.errors import ResidError
from resid.sites import Site

Storage = Literal["auto", "sparse", "dense"]
STORAGES = ("auto", "sparse", "dense")
SPARSE_BELOW = 0.25  # "auto" stores activations sparse when fewer than this fraction is non-zero


def store(acts: Tensor, storage: Storage) -> Tensor:
    """The activations as they are kept: a coalesced sparse COO tensor or the dense tensor."""
    if storage == "dense":
        return acts
    if storage == "auto" and acts.numel() and bool(acts.count_nonzero() >= SPARSE_BELOW * acts.numel()):
        return acts
    return acts.to_sparse().coalesce()


@dataclass(frozen=True)
class Encoded:
    """One dictionary's record of a run. reconstruction + error is the tensor the dictionary reconstructs (its
    hook_out), exactly up to the float rounding of one subtraction; reconstruction is
    decode(acts, input) = (acts @ W_dec + b_dec, normalization undone) + input @ W_skip."""

    dictionary: object  # the Dictionary (typed loosely: resid.dictionaries imports this module)
    stored: Tensor  # [batch pos feature], sparse COO or dense (see `storage`)
    reconstruction: Float[Tensor, "batch pos d_out"]
    error: Float[Tensor, "batch pos d_out"]
    input: Float[Tensor, "batch pos d_in"]  # what the dictionary read (for an SAE, reconstruction + error)
    mode: Literal["observe", "splice", "reconstruction"]  # Splice(error=True) is "splice", error=False the other

    @property
    def name(self) -> str:
        return self.dictionary.name

    @property
    def acts(self) -> Float[Tensor, "batch pos feature"]:
        """The feature activations, dense."""
        return self.stored.to_dense() if self.stored.is_sparse else self.stored

    @property
    def sparse(self) -> Tensor:
        """The feature activations as a coalesced sparse COO tensor [batch pos feature]."""
        return self.stored if self.stored.is_sparse else self.stored.to_sparse().coalesce()

    def active(self) -> tuple[Int[Tensor, "n 3"], Float[Tensor, " n"]]:
        """The non-zero activations: their (batch, pos, feature) indices, in that order, and their values."""
        sparse = self.sparse
        return sparse.indices().T, sparse.values()

    def __repr__(self) -> str:
        kind = "sparse" if self.stored.is_sparse else "dense"
        nonzero = int(self.stored._nnz()) if self.stored.is_sparse else int(self.stored.count_nonzero())
        return f"Encoded({self.name!r}, {self.mode}, acts {list(self.stored.shape)} {kind}, {nonzero} non-zero)"


class Recorded(Mapping):
    """The dictionaries' records of a run, by dictionary name; a Site (or its label) finds the dictionary reading
    or reconstructing that site, when exactly one does."""

    def __init__(self, records: dict[str, Encoded]):
        self._records = dict(records)

    def __getitem__(self, key: "str | Site") -> Encoded:
        if isinstance(key, str) and key in self._records:
            return self._records[key]
        try:
            site = key if isinstance(key, Site) else Site.parse(key)
        except ResidError:
            site = None
        found = [] if site is None else [e for e in self._records.values() if site in _sites(e.dictionary)]
        if len(found) == 1:
            return found[0]
        names = ", ".join(repr(n) for n in self._records) or "none"
        if len(found) > 1:
            raise ResidError(f"Several dictionaries of this run read {site.label} ({', '.join(e.name for e in found)})"
                             ": ask for one by name.")
        raise ResidError(f"No dictionary of this run is named or reads {key!r}; the run's dictionaries: {names}.")

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"Recorded({list(self._records.values())})"


def _sites(dictionary) -> tuple[Site, ...]:
    points = (getattr(dictionary, "point_in", None), getattr(dictionary, "point_out", None))
    return tuple(p.site for p in points if p is not None)

