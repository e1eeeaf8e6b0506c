"""FFN values in vocabulary space (Geva et al. 2021, "Transformer Feed-Forward Layers Are Key-Value
Memories"; Geva et al. 2022, "Transformer Feed-Forward Layers Build Predictions by Promoting Concepts in the
Vocabulary Space").

Glossary (resid.components.mlp): neuron i of layer l has *key* W_in[:, i] (with W_gate[:, i] for gated
MLPs), *value* v_i = W_out[i] [d_model] and *coefficient* m_i = post[i]; the MLP writes sum_i m_i v_i + b_out.
The value's *logits* are what v_i alone would add to each token's logit:

    through_final_norm=False:   v_i @ W_U
    through_final_norm=True:    (g * centre(v_i)) @ W_U      (g: the final norm's gain; centre: minus the
                                                             mean over d_model, LayerNorm only)

Post-norms (Gemma 2/3, OLMo 2): what neuron i writes into the residual is the post-norm of the MLP output, so
its value as written is linear_post(v_i) = g_post * centre(v_i) (the post-norm's gain; resid.components.norm),
read as above. The post-norm's own scale depends on the input (the whole MLP output) and is positive: like the
final norm's, it is left out here (sub_updates, which has a run, freezes it from that run).

Mixture of experts (Mixtral): every expert has its own values, W_out[e, i]; neurons are addressed as (expert,
neuron) and the frame gets an `expert` column after `layer` (the router weight is per token, so it is not part of
a value).

The final norm's scale (1/rms or 1/sigma) is left out: it depends on the input, is positive, and only
rescales every token's logit alike, so the ranking is the same. Bias terms (b_U, the norm's bias) do not
depend on the neuron and are left out too (model.readout.unembedding / vector_logits). Everything is computed
in float32.

`value_top_tokens` gives each neuron's top-k and bottom-k tokens. It streams over chunks of neurons so that
the [chunk d_vocab] logit block stays within `chunk_bytes` (default 256 MB): all 46,080 neurons of SmolLM2
take the effective unembedding (d_model x d_vocab) plus one chunk of memory.
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from resid.analyses.checks import check_k
from resid.analyses.io.provenance import describe
from resid.analyses.neurons.selection import Neurons, select, site_column
from resid.analyses.vocab import decode_ids
from resid.model import Transformer

CHUNK_BYTES = 256 * 2**20
# site: the neuron's Site.label (resid.analyses.neurons.selection); direction: "top" | "bottom"; rank: 1 = the
# extreme; value: the logit that v_i adds to token_id. Mixture of experts: "expert" after "layer".
COLUMNS = ("site", "layer", "neuron", "direction", "rank", "token_id", "token", "value")


def value_top_tokens(
    model: Transformer,
    layers: int | Sequence[int] | None = None,
    neurons: Neurons = None,
    k: int = 20,
    through_final_norm: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
    experts: int | Sequence[int] | None = None,
) -> pd.DataFrame:
    """Each neuron's value read in vocabulary space: its k highest and k lowest token logits.

    layers: None for all, an index or a list. neurons: resid.Sites of neurons or their labels, or None / "neuron"
    for all, or an index or a list of indices, the same neurons in every chosen layer (resid.analyses.neurons.
    selection). experts (mixture-of-experts models only): the same way, the experts whose neurons are read. One
    row per (layer, neuron, direction, rank), the columns of COLUMNS, in that order (per (layer, expert, neuron,
    ...) with an `expert` column for a mixture of experts)."""
    selection = select(model, layers, neurons, experts)
    layer_list, neuron_list, expert_list = selection.layers, selection.neurons, selection.experts
    k = check_k(k, "k", model.config.d_vocab)
    unembed = model.readout.unembedding(through_final_norm)
    index = None if neuron_list is None else torch.tensor(neuron_list, device=model.device)
    n_neurons = model.config.mlp_width(layer_list[0]) if neuron_list is None else len(neuron_list)
    rows = max(1, chunk_bytes // (4 * model.config.d_vocab))
    top_values, top_ids, bottom_values, bottom_ids = [], [], [], []
    with torch.no_grad():
        for layer, w_out in _value_matrices(model, layer_list, expert_list):
            w_out = w_out if index is None else w_out.index_select(0, index)
            for start in range(0, n_neurons, rows):
                logits = _as_written(model, layer, w_out[start : start + rows]) @ unembed
                top = logits.topk(k, dim=-1)
                bottom = logits.topk(k, dim=-1, largest=False)
                top_values.append(top.values.cpu())
                top_ids.append(top.indices.cpu())
                bottom_values.append(bottom.values.cpu())
                bottom_ids.append(bottom.indices.cpu())
                del logits
    values = torch.stack([torch.cat(top_values), torch.cat(bottom_values)], dim=1)  # [n 2 k]
    ids = torch.stack([torch.cat(top_ids), torch.cat(bottom_ids)], dim=1)
    neuron_ids = np.arange(n_neurons) if neuron_list is None else np.asarray(neuron_list)
    df = selection.keep(_frame(model, layer_list, neuron_ids, values.numpy(), ids.numpy(), expert_list))
    parameters = {**selection.parameters(), "k": k, "through_final_norm": through_final_norm}
    df.attrs["provenance"] = describe(model, "neurons.value_top_tokens", parameters)
    return df


def _value_matrices(model: Transformer, layers: list[int], experts: list[int] | None):
    """(layer, W_out [d_mlp d_model]) for every chosen layer, or for every chosen expert of it, in row order."""
    for layer in layers:
        w_out = model.blocks[layer].mlp.W_out
        if experts is None:
            yield layer, w_out
        else:
            for e in experts:
                yield layer, w_out[e]


def _as_written(model: Transformer, layer: int, values: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_model"]:
    """Values as they are written into the residual (float32): through the post-norm's gain (and centering)
    in models that have one, else as they are."""
    post_norm = model.blocks[layer].ln_mlp_post
    return values.float() if post_norm is None else post_norm.linear(values)


def _frame(
    model: Transformer,
    layers: list[int],
    neurons: np.ndarray,
    values: np.ndarray,
    ids: np.ndarray,
    experts: list[int] | None = None,
) -> pd.DataFrame:
    """Rows from [layer*(expert*)neuron 2 k] arrays, built column-wise (1.8M rows for SmolLM2 at k=20)."""
    n_rows, _, k = values.shape
    per_neuron = 2 * k
    if experts is not None:  # the (expert, neuron) pairs of a layer, in the order of _value_matrices
        expert_ids = np.repeat(np.asarray(experts, dtype=np.int64), len(neurons))
        neurons = np.tile(neurons, len(experts))
    columns = {
        "layer": np.repeat(np.asarray(layers, dtype=np.int64), len(neurons) * per_neuron),
        "neuron": np.tile(np.repeat(neurons.astype(np.int64), per_neuron), len(layers)),
        "direction": pd.Categorical.from_codes(
            np.tile(np.repeat(np.array([0, 1], dtype=np.int8), k), n_rows), categories=["top", "bottom"]
        ),
        "rank": np.tile(np.arange(1, k + 1, dtype=np.int64), 2 * n_rows),
        "token_id": ids.reshape(-1).astype(np.int64),
        "token": decode_ids(model, ids.reshape(-1)),
        "value": values.reshape(-1).astype(np.float64),
    }
    if experts is not None:
        columns = {"layer": columns.pop("layer"),
                   "expert": np.tile(np.repeat(expert_ids, per_neuron), len(layers)), **columns}
    # one label per (layer, [expert,] neuron) row of `values`, repeated over its 2k rows
    site = site_column(np.repeat(np.asarray(layers, dtype=np.int64), len(neurons)), np.tile(neurons, len(layers)),
                       None if experts is None else np.tile(expert_ids, len(layers)), repeat=per_neuron)
    return pd.DataFrame({"site": site, **columns})
