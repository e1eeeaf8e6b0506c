"""Per-head residual writes, stacked: what each attention head adds to the residual stream, computed on demand
from a run's z and the model's W_O, never stored (TransformerLens's ActivationCache.stack_head_results).

    sites, writes = head_results(run, model)          writes [head_total batch pos d_model], sites[i] its head
    head_results(run, model, layers=[3], positions=[-1], apply_ln=True)

Glossary:

    head write   head h of layer l writes z[..., h, :] @ W_O[h]; the layer's head writes plus b_O are its attention
                 write, `stream.layers[l].attn.out`
    post-norm    models with post-norms (Gemma 2/3, OLMo 2) write the attention output through a norm. With its
                 scale frozen at the run's (`post_norm_scale`) the norm is affine, so a head's write is its output
                 carried through the norm's linear part (Norm.frozen, constants=False); the head writes plus b_O
                 carried through the whole frozen norm (its bias included) are again the attention write
    head_total   len(layers) * n_heads rows, layer by layer, head by head: row i is sites[i],
                 Site(l, "attn", head=h) (TransformerLens's labels "L{l}H{h}")
    apply_ln     TransformerLens's: each write through the final norm with its scale frozen at the run's, before
                 its gain and bias (Norm.standardized: centre(x) * final_norm_scale), i.e. what each head adds to
                 the standardized final residual the unembedding reads. TransformerLens with a layer argument
                 uses that layer's ln1 instead; resid always uses the final norm. Pre-LN models only: in a post-LN
                 model (BERT) every later residual norm acts on the writes too

Memory: the answer is allocated once, at the layers and prompt-relative positions asked for, and filled one layer
at a time from that layer's z at those positions alone: nothing larger than the answer plus one layer's share of
it exists at once, so a caller bounds the memory by what it asks (e.g. positions=[-1] for each prompt's last token).
"""

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from resid.errors import ResidError
from resid.model import Transformer
from resid.run import Run
from resid.sites import Site


def head_results(
    run: Run,
    model: Transformer,
    layers: int | Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    apply_ln: bool = False,
) -> tuple[list[Site], Float[Tensor, "head_total batch pos d_model"]]:
    """Every head's write at `layers` (one layer, several, or None: every layer the run has; negative counts from
    the last) and at the prompt-relative `positions` (None: every position the run captured), stacked, with each
    row's Site (see the module docstring). The run must have captured attn z (Capture(attn={"z"})), and in
    post-norm models post_norm_scale; apply_ln reads the final norm's scale (captured by default)."""
    stream, config = run.stream, model.config
    ran = len(stream.layers)
    layers = range(ran) if layers is None else [layers] if isinstance(layers, int) else layers
    chosen = [Site(layer, "attn").resolve(config, None if ran == config.n_layers else ran).layer for layer in layers]
    index = _positions(run, positions)
    final_scale = _final_scale(run, model, index) if apply_ln else None
    zs = [_at(stream.layers[layer].attn.z, index) for layer in chosen]  # each layer's z, read before allocating
    kept = index if index is not None else stream.captured if stream.captured is not None else run.tokens.ids
    n_pos = kept.shape[1]
    writes = torch.empty(len(chosen) * config.n_heads, run.tokens.ids.shape[0], n_pos, config.d_model,
                         dtype=model.dtype, device=model.device)
    sites = []
    for i, (layer, z) in enumerate(zip(chosen, zs, strict=True)):
        block = model.blocks[layer]
        heads = torch.einsum("bphe,hed->hbpd", z, block.attn.W_O)
        if block.ln_attn_post is not None:  # the write is the output through the post-norm, its scale frozen
            scale = _at(stream.layers[layer].attn.post_norm_scale, index)
            heads = block.ln_attn_post.frozen(heads, scale, constants=False)
        if final_scale is not None:
            heads = model.ln_final.standardized(heads, final_scale.expand(*heads.shape[:-1], 1))
        writes[i * config.n_heads:(i + 1) * config.n_heads] = heads.to(writes.dtype)
        sites += [Site(layer, "attn", head=head) for head in range(config.n_heads)]
    return sites, writes


def _positions(run: Run, positions: Sequence[int] | None) -> Tensor | None:
    """[batch k] padded indices of the prompt-relative positions, or None for every position the run kept."""
    if positions is None:
        return None
    if run.stream.captured is not None:
        raise ResidError("head_results(positions=...): this run kept only some positions (Capture(positions=...)); "
                         "leave positions=None to get the positions it kept, or run with every position captured.")
    return run.tokens.padded_index(positions)


def _at(tensor: Tensor, index: Tensor | None) -> Tensor:
    """tensor [batch pos ...] at the [batch k] padded indices (all of it for None)."""
    if index is None:
        return tensor
    index = index.to(tensor.device)
    return tensor.gather(1, index.view(*index.shape, *([1] * (tensor.ndim - 2))).expand(-1, -1, *tensor.shape[2:]))


def _final_scale(run: Run, model: Transformer, index: Tensor | None) -> Tensor:
    """The final norm's frozen scale at the positions, for apply_ln (pre-LN models, runs that reached it)."""
    if model.config.post_ln:
        raise ResidError(f"head_results(apply_ln=True): {model.name} is post-LN (its residual is normed after every "
                         "write), so a head's write passes through every later norm, not the final one alone; "
                         "use apply_ln=False, or resid.analyses.attribution for contributions to the logits.")
    if len(run.stream.layers) < model.config.n_layers:
        raise ResidError("head_results(apply_ln=True): this run stopped before the final norm (stop_at_layer); "
                         "use apply_ln=False, or run every layer.")
    return _at(run.stream.final_norm_scale, index)
