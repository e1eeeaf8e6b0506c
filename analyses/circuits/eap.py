"""Edge attribution patching (EAP; Syed et al. 2023): every edge's patching effect estimated at once, from one clean
and one corrupt forward pass and one backward pass per batch of pairs,

    score(w, r) = sum over positions of (reference_w - clean_w) . d metric / d input_r      (at the clean run)

the first-order change of the metric when reader r reads writer w's reference (corrupt) output instead of its
clean one. d metric / d input_r comes from one backward pass for every reader at once (resid.analyses.circuits.
patched: from the taps of the model's own forward where nothing is patched, EAP and EAP-IG on the inputs, and
every reader is a pre-norm projection (`tappable`); from a zero probe on every reader's input elsewhere: EAP-IG on
the activations, latent attention, models without pre-norms); a head's write is z[h] @ W_O[h], whose constant b_O
cancels in the difference. EAP-IG (resid.analyses.circuits.eap_ig) averages the same gradient over points between
the corrupt and the clean run (`gradient_scores`'s `alphas`).
"""

from collections.abc import Callable, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from resid.analyses.circuits.graph import EdgeGraph
from resid.analyses.circuits.inputs import KL, measure, pairs_of
from resid.analyses.circuits.patched import EdgePass, plain_writes
from resid.analyses.circuits.scores import batch_tensors, edge_scores
from resid.analyses.circuits.seq2seq import Model, decoder_only
from resid.analyses.circuits.taps import input_gradients, tappable
from resid.analyses.circuits.writes import Writes
from resid.analyses.distributed.execution import Execution, as_execution
from resid.capture import Capture
from resid.errors import ResidError, param
from resid.model import Inputs, Transformer
from resid.tokenizer import Tokens


def eap(
    model: Model,
    clean: Inputs,
    corrupt: Inputs,
    targets: Sequence[str | int] | str | int,
    baselines: Sequence[str | int] | str | int | None = None,
    metric: str | Callable | None = None,
    execution: Execution | None = None,
) -> pd.DataFrame:
    """EAP scores of every edge of the model's edge graph (resid.analyses.circuits.graph), the mean over the pairs:
    one row per edge (resid.analyses.circuits.scores' table). metric: "logit_diff" with baselines (the default
    then), "target_prob" (the default without), "logit", "loss", "kl" (whose gradient vanishes at the clean run:
    EAP of "kl" is zero, use eap_ig), or a function of the logits."""
    decoder_only(model, "EAP")
    pairs = pairs_of(model, clean, corrupt, targets, baselines, metric)
    if pairs.metric == KL:
        raise ResidError(f"EAP of {param('metric', KL)} is zero: the KL divergence from the clean run has no "
                         "gradient at the clean run. Use circuits.eap_ig, or another metric.")
    return edge_scores(model, pairs, "eap", gradient_batches((1.0,), "activations"), {}, as_execution(execution))


def gradient_batches(alphas: Sequence[float], on: str):
    def batch_scores(model: Transformer, graph: EdgeGraph, pairs, rows: list[int], job) -> Tensor:
        clean, corrupt, t, b = batch_tensors(model, pairs, rows, job)
        return gradient_scores(model, graph, clean, corrupt, t, b, job.metric, alphas, on)
    return batch_scores


def gradient_scores(
    model: Transformer,
    graph: EdgeGraph,
    clean: Tokens,
    corrupt: Tokens,
    targets: Int[Tensor, "n"],
    baselines: Int[Tensor, "n"] | None,
    metric: str | Callable,
    alphas: Sequence[float],
    on: str,
) -> Float[Tensor, "writer reader"]:
    """The [writer reader] scores of a batch, summed over its pairs: (corrupt - clean writes) . the mean over
    `alphas` of d metric / d input_r at the point alpha of the way from the corrupt run to the clean one (alpha 1:
    the clean run, EAP). on="inputs": the embeddings interpolated (EAP-IG); "activations": every edge's term
    interpolated (keep = alpha)."""
    corrupt_writes = plain_writes(model, corrupt)
    clean_logits = None
    if metric == KL:
        with torch.no_grad():
            clean_logits = model.run(clean, capture=Capture.none(), logits_at="last").logits[:, 0]
    n, n_pos, d_model = corrupt_writes.embed.shape
    exact = torch.promote_types(model.dtype, torch.float32)  # sums in float32 at least (float64 models: float64)
    gradient = torch.zeros(n, n_pos, len(graph.readers), d_model, dtype=exact, device=model.device)
    clean_writes = None
    for alpha in sorted(alphas, reverse=True):  # alpha 1 first: the clean run, whose writes are the clean ones
        own = alpha == 1.0 or on == "inputs"  # the model's own forward (on its interpolated embeddings)
        taps = own and tappable(model, graph)  # then taps, where every reader is a pre-norm projection
        probe = None if taps else torch.zeros(n, n_pos, len(graph.readers), d_model, dtype=model.dtype,
                                              device=model.device, requires_grad=True)
        if own:
            embed = None if alpha == 1.0 else corrupt_writes.embed + alpha * (clean_writes.embed -
                                                                              corrupt_writes.embed)
            edge_pass = EdgePass(model, graph, None, None, probe, embed=embed, taps=taps)
        else:
            keep = torch.full((1, len(graph.writers), len(graph.readers)), alpha, device=model.device)
            edge_pass = EdgePass(model, graph, corrupt_writes, keep, probe)
        run = model.run(clean, capture=Capture.none(), interventions=edge_pass.interventions(), logits_at="last",
                        grad=True)
        clean_writes = edge_pass.writes() if alpha == 1.0 else clean_writes
        value = measure(metric, run.logits[:, 0], targets, baselines, clean_logits).sum()
        if probe is None:
            gradient += input_gradients(edge_pass, value)
        else:
            (g,) = torch.autograd.grad(value, probe)
            gradient += g.to(exact)
    gradient /= len(alphas)
    with torch.no_grad():
        return _scores(model, graph, clean_writes, corrupt_writes, gradient)


def _scores(model: Transformer, graph: EdgeGraph, clean: Writes, corrupt: Writes,
            gradient: Float[Tensor, "n pos reader d_model"]) -> Float[Tensor, "writer reader"]:
    """(corrupt - clean write) . gradient for every writer and every reader after it, summed over pairs and
    positions; 0 off the edges."""
    dtype = gradient.dtype
    # every reader's gradient as one row [reader (n pos d_model)] and every writer's difference as one row [writer
    # (n pos d_model)], each laid out once: the scores are one matrix product (entries off the edges, computed too,
    # are zeroed), which reads the gradient once (per writer group, einsums copied it and products re-read it)
    rows = gradient.permute(2, 0, 1, 3).reshape(gradient.shape[2], -1)
    diffs = torch.empty(len(graph.writers), rows.shape[1], dtype=dtype, device=gradient.device)

    def flat(diff: Tensor) -> Tensor:  # [n pos w d_model] -> [w (n pos d_model)]
        return diff.to(dtype).permute(2, 0, 1, 3).reshape(diff.shape[2], -1)

    diffs[0] = flat((corrupt.embed - clean.embed)[:, :, None])[0]
    for layer in range(graph.n_layers):
        if graph.heads_write:
            w_o = model.blocks[layer].attn.W_O.to(dtype)
            diff = torch.einsum("nphe,hed->nphd", (corrupt.z[layer] - clean.z[layer]).to(dtype), w_o)
        else:  # post-norms: the layer's attention writes as one
            diff = (corrupt.attn[layer] - clean.attn[layer]).to(dtype)[:, :, None]
        diffs[graph.writer_slice(layer, "attn")] = flat(diff)
        diffs[graph.writer_slice(layer, "mlp")] = flat((corrupt.mlp[layer] - clean.mlp[layer])[:, :, None])
    scores = diffs @ rows.T
    return scores * graph.valid.to(scores.device)
