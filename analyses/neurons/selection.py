"""Which neurons a neuron table covers, and each row's Site: `layers=`, `neurons=` and `experts=` checked into one
`Selection`, and the `site` column (Site.label, as every table writes it: resid.analyses.site_words) of the three
neuron tables (values, keys, sub-updates), so that they join with attribution, ablation and patching tables.

`neurons=` takes, as `sites=` does in ablation and patching:

    None, or the word "neuron"           every neuron of the chosen layers (and experts)
    resid.Site(l, "mlp", neuron=i), its label "layers[l].mlp.neuron[i]", or a list of them
                                         those neurons ("layers[l].mlp.expert[e].neuron[i]" in a mixture of
                                         experts); their layers and experts are the table's, so `layers=` and
                                         `experts=` are left None
    an index, or a list of indices       the same neurons in every chosen layer (a shorthand)

Sites are read on the grid of their layers x neurons (x experts), which costs what each neuron alone costs (a
neuron's values, keys and top-k do not depend on the others), and the table keeps the rows of the sites named.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from resid.analyses import site_words
from resid.analyses.checks import has_experts, select_layers, select_neurons
from resid.errors import ResidError, param
from resid.model import Transformer
from resid.sites import Site

WORD = "neuron"  # every neuron of the chosen layers

Neurons = int | Site | str | Sequence[int] | Sequence[Site | str] | None


@dataclass(frozen=True)
class Selection:
    """The neurons of a table: the grid layers x [experts x] neurons, and the Sites named one by one (if any)."""

    layers: list[int]  # checked, sorted, non-negative
    neurons: list[int] | None  # the same in every layer, checked and sorted; None: every neuron
    experts: list[int] | None  # mixture-of-experts layers: the experts whose neurons are read; None: dense MLPs
    sites: tuple[Site, ...] | None = None  # the neurons named one by one (resolved); None: the whole grid

    def parameters(self) -> dict:
        """The selection as a table's provenance records it."""
        named = {"neurons": self.neurons} if self.sites is None else {"neurons": [s.label for s in self.sites]}
        return {"layers": self.layers, **named, **({} if self.experts is None else {"experts": self.experts})}

    def keep(self, df: pd.DataFrame) -> pd.DataFrame:
        """The rows of the named sites (all rows when none were named), with the site column's unused labels gone."""
        if self.sites is None:
            return df
        kept = df[df["site"].isin([site.label for site in self.sites])].reset_index(drop=True)
        kept["site"] = kept["site"].cat.remove_unused_categories()
        return kept


def select(model: Transformer, layers: int | Sequence[int] | None, neurons: Neurons,
           experts: int | Sequence[int] | None = None) -> Selection:
    """The Selection of a neuron table's `layers`, `neurons` and `experts` (see the module docstring)."""
    if isinstance(neurons, str) and neurons == WORD:
        neurons = None
    named = _sites(model, neurons)
    if named is None:
        layer_list = select_layers(model, layers)
        return Selection(layer_list, select_neurons(model, neurons, layer_list),
                         select_experts(model, experts, layer_list))
    for name, value in (("layers", layers), ("experts", experts)):
        if value is not None:
            raise ResidError(f"{param('neurons')} names resid.Sites, which carry their layers and experts: leave "
                             f"{param(name)}=None (got {value!r}).")
    layer_list = sorted({site.layer for site in named})
    has_experts(model, layer_list)  # one kind of MLP per table
    found = sorted({site.expert for site in named if site.expert is not None})
    return Selection(layer_list, sorted({site.neuron for site in named}),
                     select_experts(model, found or None, layer_list), tuple(named))


def _sites(model: Transformer, neurons: Neurons) -> list[Site] | None:
    """The resolved neuron Sites `neurons` names, or None when it is None, an index or a list of indices."""
    if neurons is None or isinstance(neurons, int):
        return None
    items = [neurons] if isinstance(neurons, (Site, str)) else list(neurons) if isinstance(neurons, Sequence) else None
    if not items or not any(isinstance(item, (Site, str)) for item in items):
        return None  # indices (checked by select_neurons), or a value it refuses with its message
    if not all(isinstance(item, (Site, str)) for item in items):
        raise ResidError(f"{param('neurons')} mixes resid.Sites and indices ({neurons!r}): give a list of neuron "
                         "Sites (Site(l, 'mlp', neuron=i)) or a list of indices, the same neurons in every layer.")
    for item in items:
        if isinstance(item, str) and item in site_words.WORDS and item != WORD:
            raise ResidError(f"{param('neurons')}={item!r}: the neuron tables read neurons; the word they take is "
                             f"{WORD!r} (every neuron), or a list of Site(l, 'mlp', neuron=i).")
    sites = site_words.expand(items, model.config, name="neurons")
    for site in sites:
        if site.part != "mlp" or site.neuron is None or site.field is not None or site.positions is not None:
            raise ResidError(f"{param('neurons')}: {site.label} is not a neuron; a neuron table reads MLP neurons, "
                             "Site(l, 'mlp', neuron=i) ('layers[l].mlp.neuron[i]'; in a mixture of experts "
                             "Site(l, 'mlp', expert=e, neuron=i)), over every position.")
    return sites


def select_experts(
    model: Transformer, experts: int | Sequence[int] | None, layers: Sequence[int] | None = None
) -> list[int] | None:
    """Expert indices, checked and sorted, for a mixture-of-experts model (every expert when None); None for a
    dense model, which must not be given experts. `layers` (checked indices): the MLPs these are for, all of one
    kind (DeepSeek's first layers are dense); None: the model's."""
    n = model.config.n_experts if layers is None or has_experts(model, layers) else 0
    if not n:
        if experts is not None:
            which = f"{model.name}'s MLPs are" if layers is None else f"the MLPs of layers {list(layers)} are"
            raise ResidError(f"experts={experts!r}: {which} dense, not mixtures of experts. Leave "
                             "experts=None.")
        return None
    if experts is None:
        return list(range(n))
    chosen = [experts] if isinstance(experts, int) else list(experts)
    bad = [e for e in chosen if not isinstance(e, int) or isinstance(e, bool) or not 0 <= e < n]
    if bad or not chosen:
        raise ResidError(f"Experts {bad or chosen} are not valid: each MLP has {n} experts (0..{n - 1}); pass None "
                         "for all, an index or a non-empty list.")
    return sorted(set(chosen))


def site_column(layer: np.ndarray, neuron: np.ndarray, expert: np.ndarray | None = None,
                repeat: int = 1) -> pd.Categorical:
    """The `site` column of a neuron table: each row's Site.label, as a categorical (one label per neuron, however
    many rows it has). `repeat`: each given row stands for that many consecutive rows (the values table's 2k)."""
    columns = [np.asarray(c, dtype=np.int64) for c in ([layer, neuron] if expert is None else [layer, expert, neuron])]
    if not len(columns[0]):
        return pd.Categorical([], categories=[])
    sizes = [int(c.max()) + 1 for c in columns]
    flat, codes = np.unique(np.ravel_multi_index(columns, sizes), return_inverse=True)  # one integer per neuron
    unique = np.stack(np.unravel_index(flat, sizes), axis=1)
    groups = unique[:, :-1]  # (layer[, expert]) of each unique neuron, sorted, so each group is one run
    starts = np.flatnonzero(np.r_[True, (groups[1:] != groups[:-1]).any(1)])
    labels: list[str] = []
    for start, end in zip(starts, np.r_[starts[1:], len(unique)]):
        group = [int(v) for v in groups[start]]
        labels += _labels(group[0], group[1] if len(group) > 1 else None, unique[start:end, -1].tolist())
    return pd.Categorical.from_codes(np.repeat(codes.reshape(-1), repeat), categories=labels)


def _labels(layer: int, expert: int | None, neurons: list[int]) -> list[str]:
    """Site.label of neurons of one layer (and expert): Site builds the first and the last, and the others follow
    the first's pattern with their index (46,080 Sites would take seconds to check one by one)."""
    def label(i: int) -> str:
        return Site(layer, "mlp", neuron=i, expert=expert).label

    first = label(neurons[0])
    pattern = first.removesuffix(f"[{neurons[0]}]") + "[{}]"
    if pattern.format(neurons[-1]) != label(neurons[-1]):  # a label grammar the pattern does not follow
        return [label(i) for i in neurons]
    return [pattern.format(i) for i in neurons]
