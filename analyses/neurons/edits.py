"""Promote or suppress FFN memories by editing their coefficients (Geva et al. 2022, section 5: turning
on "promoting" sub-updates steers the prediction toward the concepts their values encode).

Glossary: neuron i of a layer writes m_i * v_i, m_i = post[i] its coefficient (resid.components.mlp).
*Setting* a coefficient replaces m_i by a value; *scaling* multiplies it (0 switches the memory off).

    edits = neuron_edits.set_coefficients(model, prompts, [(20, 5), (21, 7)], value=10.0, positions=[-1])
    df = neuron_edits.prediction_change(model, prompts, edits, k=10)

Positions are prompt-relative (0 = a prompt's first real token, -1 its last), so they mean the same token
in every prompt whatever the padding. The edits are plain resid.Replace / resid.Scale interventions on neuron
sites with those positions (resid.Site resolves them per batch), so they can be run on any prompts; `prompts`
is only used to check the positions exist in every prompt.

Mixture of experts (Mixtral): neurons are (layer, expert, neuron) triples, sites Site(layer, "mlp", expert=e,
neuron=i); expert e's neuron writes w_e * m_{e,i} * v_{e,i}, so an edit changes nothing at tokens not routed to e
(their router weight w_e is 0), and routing itself is never changed. Post-norms: the edited coefficient goes
through the post-norm with the rest of the MLP output (its scale recomputed, as in any forward pass).
"""

import dataclasses
from collections.abc import Sequence
from numbers import Real

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses.checks import check_k
from resid.analyses.inputs import prompts as as_prompts
from resid.analyses.io.provenance import describe
from resid.analyses.vocab import decode_ids
from resid.capture import Capture
from resid.errors import ResidError
from resid.interventions import Intervention, Replace, Scale, Site
from resid.model import Inputs, Transformer

# (layer, neuron) pairs, or (layer, expert, neuron) triples for a mixture of experts (checked here, for a
# clearer error than a type check)
Neurons = Sequence[Sequence[int] | Site | str]  # (layer, neuron) or (layer, expert, neuron), or a neuron Site


def set_coefficients(
    model: Transformer,
    prompts: Inputs,
    neurons: Neurons,
    value: Real | Sequence[Real],
    positions: Sequence[int] | None = None,
) -> list[Intervention]:
    """Interventions that set each neuron's coefficient to `value` (one, or one per neuron) at the
    prompt-relative `positions` of every prompt (None: at every token)."""
    sites = _sites(model, prompts, neurons, positions)
    values = _per_neuron(value, len(sites), "value")
    return [Replace(site, torch.tensor(v)) for site, v in zip(sites, values)]


def scale_coefficients(
    model: Transformer,
    prompts: Inputs,
    neurons: Neurons,
    factor: Real | Sequence[Real],
    positions: Sequence[int] | None = None,
) -> list[Intervention]:
    """Interventions that multiply each neuron's coefficient by `factor` (0 suppresses, > 1 promotes) at
    the prompt-relative `positions` of every prompt (None: at every token)."""
    sites = _sites(model, prompts, neurons, positions)
    factors = _per_neuron(factor, len(sites), "factor")
    return [Scale(site, f) for site, f in zip(sites, factors)]


def prediction_change(
    model: Transformer, prompts: Inputs, interventions: Sequence[Intervention], k: int = 10
) -> pd.DataFrame:
    """How the next-token prediction at each prompt's last token changes under `interventions`.

    One row per (prompt, token) for the union of the clean and the edited top-k: prompt_idx token_id token
    clean_rank edited_rank (1 = most likely) clean_prob edited_prob prob_delta clean_logit edited_logit
    logit_delta, ordered by prompt and edited rank."""
    k = check_k(k, "k", model.config.d_vocab)
    given = as_prompts(model, prompts)
    tokens = given.tokens
    clean = model.run(tokens, capture=Capture.none(), logits_at="last").logits[:, 0].float()
    edited = model.run(tokens, capture=Capture.none(), interventions=interventions, logits_at="last").logits[:, 0]
    edited = edited.float()
    frames = []
    for row in range(clean.shape[0]):
        ids = torch.cat([clean[row].topk(k).indices, edited[row].topk(k).indices]).unique()
        frames.append(_compare(clean[row], edited[row], ids, row))
    df = pd.concat(frames, ignore_index=True)
    df.insert(2, "token", decode_ids(model, df["token_id"].to_numpy()))
    df = df.sort_values(["prompt_idx", "edited_rank"], ignore_index=True)
    sites = [f"{type(iv).__name__} {iv.site.label}" for iv in interventions]
    parameters = {"k": k, "interventions": sites}
    df.attrs["provenance"] = describe(model, "neurons.prediction_change", parameters, given.record())
    return df


def _compare(clean: Tensor, edited: Tensor, ids: Tensor, row: int) -> pd.DataFrame:
    columns = {"prompt_idx": np.full(len(ids), row, dtype=np.int64), "token_id": ids.cpu().numpy().astype(np.int64)}
    for name, logits in (("clean", clean), ("edited", edited)):
        chosen = logits[ids]
        columns[f"{name}_rank"] = ((logits[None, :] > chosen[:, None]).sum(-1) + 1).cpu().numpy().astype(np.int64)
        columns[f"{name}_prob"] = torch.softmax(logits, -1)[ids].double().cpu().numpy()
        columns[f"{name}_logit"] = chosen.double().cpu().numpy()
    columns["prob_delta"] = columns["edited_prob"] - columns["clean_prob"]
    columns["logit_delta"] = columns["edited_logit"] - columns["clean_logit"]
    order = ["prompt_idx", "token_id", "clean_rank", "edited_rank", "clean_prob", "edited_prob", "prob_delta",
             "clean_logit", "edited_logit", "logit_delta"]
    return pd.DataFrame({name: columns[name] for name in order})


def _sites(model: Transformer, prompts: Inputs, neurons: Neurons, positions: Sequence[int] | None) -> list[Site]:
    """One checked Site per neuron at `positions`, which must exist in every prompt."""
    pairs = list(neurons)
    if not pairs:
        raise ResidError("No neurons given: pass a non-empty list of (layer, neuron) pairs.")
    sites = []
    size, shape = (3, "(layer, expert, neuron) triples") if model.config.n_experts else (2, "(layer, neuron) pairs")
    for pair in pairs:
        if isinstance(pair, (Site, str)):  # a neuron's Site, or its label: "layers[20].mlp.neuron[894]"
            site = Site.parse(pair) if isinstance(pair, str) else pair
            if site.part != "mlp" or site.neuron is None or site.field is not None:
                raise ResidError(f"Neurons must be neuron sites (Site(l, 'mlp', neuron=i)), got {site.label}.")
            site = dataclasses.replace(site, positions=positions)
        elif isinstance(pair, (tuple, list)) and len(pair) == size and all(isinstance(x, int) for x in pair):
            site = Site(pair[0], "mlp", neuron=pair[-1], positions=positions, expert=pair[1] if size == 3 else None)
        else:
            experts = " (this model's MLPs are mixtures of experts)" if size == 3 else ""
            raise ResidError(f"Neurons must be {shape} of integers{experts}, or neuron Sites, got {pair!r}.")
        sites.append(site.resolve(model.config))
    if positions is not None:
        model.as_tokens(prompts).padded_index(list(positions))
    return sites


def _per_neuron(value: Real | Sequence[Real], n: int, name: str) -> list[float]:
    values = [value] * n if isinstance(value, Real) else list(value)
    if len(values) != n:
        raise ResidError(f"Got {len(values)} {name}s for {n} neurons: give one {name}, or one per neuron.")
    return [float(v) for v in values]
