"""What a dictionary computed in a run (`run.dictionaries[name]`): its feature activations, its reconstruction and
its error term, at the run's captured positions. Activations are 0 at padding (at_real_tokens), and the
reconstruction there is the decoding of those zeros.

Axes as in resid.dictionaries.dictionary: `feature` the dictionary's features, `d_in` / `d_out` the widths of the
tensors it reads and reconstructs.

Feature activations are mostly zero (a few dozen of 16k features fire on a token), so they are stored as a torch
sparse COO tensor when fewer than a quarter are non-zero ("auto"), or always sparse / always dense on request.
A cross-layer transcoder's record (CrossLayerEncoded) holds the same per layer (resid.dictionaries.crosslayer_run).
"""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from resid.dictionaries.dictionary import product
from resid.errors import ResidError
from resid.sites import Site

Storage = Literal["auto", "sparse", "dense"]
STORAGES = ("auto", "sparse", "dense")
SPARSE_BELOW = 0.25  # "auto" stores activations sparse when fewer than this fraction is non-zero


def at_real_tokens(acts: Float[Tensor, "*layer batch pos feature"], mask: Tensor) -> Tensor:
    """The activations with those at padding zeroed, as the attention mask ([batch pos] bool, False at padding)
    says: a pad token is no part of any prompt, so its features do not fire (left padding gave them values)."""
    return torch.where(mask[..., None].to(acts.device), acts, torch.zeros((), dtype=acts.dtype, device=acts.device))


def real_tokens(run) -> Tensor:
    """[batch pos] bool: which of a run's recorded positions hold real tokens (its captured ones, or all)."""
    mask, captured = run.tokens.attention_mask, run.stream.captured
    return mask if captured is None else mask.gather(1, captured.to(mask.device))


def store(acts: Sequence[Tensor], storages: Sequence[Storage]) -> list[Tensor]:
    """Every dictionary's activations of a batch as they are kept (storages[i] for acts[i]): a coalesced sparse COO
    tensor or the dense tensor. The one host reading of a batch: the counts of non-zero activations of all those
    that may be sparse, read together (a sparse tensor's size is its count), each then converted without asking
    again."""
    maybe = [i for i, storage in enumerate(storages) if storage != "dense"]
    counts = dict(zip(maybe, torch.stack([acts[i].count_nonzero() for i in maybe]).tolist() if maybe else []))
    return [_sparse(a, counts[i]) if _kept_sparse(storages[i], counts.get(i), a.numel()) else a
            for i, a in enumerate(acts)]


def _kept_sparse(storage: Storage, count: int | None, numel: int) -> bool:
    if storage == "dense":
        return False
    return storage == "sparse" or not numel or count < SPARSE_BELOW * numel


def _sparse(acts: Tensor, count: int) -> Tensor:
    """acts as a coalesced sparse COO tensor, given its count of non-zero entries (nonzero_static: no host reading;
    it lists them in row-major order, which is what coalesced means)."""
    index = torch.nonzero_static(acts, size=count).T
    return torch.sparse_coo_tensor(index, acts[tuple(index)], acts.shape, is_coalesced=True,
                                   check_invariants=False)


@dataclass(frozen=True)
class LayerRecord:
    """What one layer's transcoder computed in a run, whatever the kind of transcoders (the transcoder protocol,
    resid.dictionaries.transcoders): its activations, reconstruction, error and input, [batch pos ...]."""

    acts: Float[Tensor, "batch pos feature"]
    reconstruction: Float[Tensor, "batch pos d_out"]
    error: Float[Tensor, "batch pos d_out"]
    input: Float[Tensor, "batch pos d_in"]


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

    def feature(self, index: int) -> Float[Tensor, "batch pos"]:
        """One feature's activation."""
        if not 0 <= index < self.stored.shape[-1]:
            raise ResidError(f"Dictionary {self.name!r} has {self.stored.shape[-1]} features; feature {index} is out "
                             "of range.")
        return self.stored.select(-1, index).to_dense() if self.stored.is_sparse else self.stored[..., index]

    def output_scale(self) -> tuple[Tensor | None, Tensor | None]:
        """(s, t) [batch pos 1] / [batch pos 1] with reconstruction = (acts @ W_dec + b_dec) * s + t (+ skip): the
        input normalization undone (None, None without one). A feature then writes a_i * W_dec[i] * s."""
        d = self.dictionary
        if d.normalize_activations == "none":
            return None, None
        _, scale, shift = d._normalize(self.input)
        return (1 / scale, None) if shift is None else (scale, shift)

    def term(self, what: str) -> Float[Tensor, "batch pos d_out"]:
        """A term of the reconstruction: "reconstruction", "error", "skip" (input @ W_skip) or "b_dec" (the decoder
        bias, normalization undone), [batch pos d_out]."""
        if what in ("reconstruction", "error"):
            return getattr(self, what)
        d = self.dictionary
        if what == "skip":
            if d.W_skip is None:
                raise ResidError(f"Dictionary {self.name!r} has no skip path (W_skip).")
            return product(self.input, d.W_skip).to(self.reconstruction.dtype)
        if what != "b_dec":
            raise ResidError(f"A dictionary's terms are reconstruction, error, skip and b_dec, not {what!r}.")
        scale, shift = self.output_scale()
        bias = d.b_dec.float().expand(self.reconstruction.shape)
        bias = bias if scale is None else bias * scale
        return (bias if shift is None else bias + shift).to(self.reconstruction.dtype)

    def __repr__(self) -> str:
        kind = "sparse" if self.stored.is_sparse else "dense"
        nonzero = int(self.stored._nnz()) if self.stored.is_sparse else int(self.stored.count_nonzero())
        return f"Encoded({self.name!r}, {self.mode}, acts {list(self.stored.shape)} {kind}, {nonzero} non-zero)"


@dataclass(frozen=True)
class CrossLayerEncoded:
    """What a cross-layer transcoder computed in a run; reconstruction[t] + error[t] is layer t's MLP write."""

    dictionary: object  # the CrossLayerTranscoder (typed loosely, as Encoded's)
    stored: tuple[Tensor, ...]  # per source layer, [batch pos feature], sparse COO or dense
    reconstruction: Float[Tensor, "layer batch pos d_out"]
    error: Float[Tensor, "layer batch pos d_out"]
    input: Float[Tensor, "layer batch pos d_in"]  # what each layer's features read
    mode: Literal["observe", "splice", "reconstruction"]

    @property
    def name(self) -> str:
        return self.dictionary.name

    @property
    def acts(self) -> Float[Tensor, "layer batch pos feature"]:
        """Every source layer's feature activations, dense."""
        return torch.stack([self.layer_acts(l) for l in range(len(self.stored))])

    def layer_acts(self, layer: int) -> Float[Tensor, "batch pos feature"]:
        """Source layer `layer`'s feature activations, dense."""
        self._check(layer, "layer")
        stored = self.stored[layer]
        return stored.to_dense() if stored.is_sparse else stored

    def written(self, source: int, target: int) -> Float[Tensor, "batch pos d_out"]:
        """What source layer's features write into target layer's MLP write, acts[source] @ W_dec[source][:,
        target - source] (zero contribution for source > target is refused: a feature writes forward only)."""
        self._check(source, "source")
        self._check(target, "target")
        if source > target:
            raise ResidError(f"Cross-layer transcoder {self.name!r}: layer {source}'s features write into layers "
                             f"{source}.., not into layer {target}.")
        w = self.dictionary.W_dec[source][:, target - source]
        acts = self.layer_acts(source)
        return product(acts, w).to(self.reconstruction.dtype)

    def _check(self, layer: int, what: str) -> None:
        n = len(self.stored)
        if not 0 <= layer < n:
            raise ResidError(f"Cross-layer transcoder {self.name!r} spans layers 0..{n - 1}; {what} {layer} is out "
                             "of range.")

    def __repr__(self) -> str:
        nonzero = sum(int(s._nnz()) if s.is_sparse else int(s.count_nonzero()) for s in self.stored)
        return f"CrossLayerEncoded({self.name!r}, {self.mode}, {len(self.stored)} layers, {nonzero} non-zero)"


class Recorded(Mapping):
    """The dictionaries' records of a run, by dictionary name; a Site (or its label) finds the dictionary reading
    or reconstructing that site, when exactly one does, or the one its `dictionary` names."""

    def __init__(self, records: dict[str, "Encoded | CrossLayerEncoded"]):
        self._records = dict(records)

    def __getitem__(self, key: "str | Site") -> "Encoded | CrossLayerEncoded":
        if isinstance(key, str) and key in self._records:
            return self._records[key]
        try:
            site = key if isinstance(key, Site) else Site.parse(key)
        except ResidError:
            site = None
        if site is not None and site.dictionary is not None:  # a feature or term of a named dictionary
            return self[site.dictionary]
        if site is not None and site.of_dictionary:
            site = site.reconstructed
        found = [] if site is None else [e for e in self._records.values() if site in _sites(e.dictionary)]
        if site is not None and not found:  # Site(l, "attn") finds a dictionary on the attention's z too
            found = [e for e in self._records.values()
                     if (site.layer, site.part) in {(s.layer, s.part) for s in _sites(e.dictionary)}]
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

