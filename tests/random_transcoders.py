"""Random transcoders for the tiny test models: one per layer (ReLU or JumpReLU, optionally with a skip path) or a
cross-layer transcoder, sparse enough that a few features fire per position, checked against the model."""

import torch

import resid
from resid.dictionaries import ActivationFunction, Binding, CrossLayerTranscoder, Dictionary, Weights, check


def mlp_input_hook(model: resid.Transformer, layer: int, standardized: bool = True) -> str:
    """The TransformerLens name of the MLP's input: ln2.hook_normalized (before the gain) or mlp.hook_in (after
    it) where the model has pre-norms, hook_mlp_in (the residual) where it has none."""
    if not model.config.pre_norms:
        return f"blocks.{layer}.hook_mlp_in"
    return f"blocks.{layer}.ln2.hook_normalized" if standardized else f"blocks.{layer}.mlp.hook_in"


def per_layer(model: resid.Transformer, d_sae: int = 40, seed: int = 0, skip_layer: int | None = 1,
              activation: str = "relu", standardized: bool = True, before_post_norm: bool = False) -> list[Dictionary]:
    out = []
    d = model.config.d_model
    for layer in range(model.config.n_layers):
        g = torch.Generator().manual_seed(seed + layer)
        threshold = 0.1 * torch.rand(d_sae, generator=g) if activation == "jumprelu" else None
        W_enc, b_enc = torch.randn(d, d_sae, generator=g) / d**0.5, -0.3 * torch.rand(d_sae, generator=g)
        W_dec, b_dec = torch.randn(d_sae, d, generator=g) / d_sae**0.5, 0.1 * torch.randn(d, generator=g)
        W_skip = 0.1 * torch.randn(d, d, generator=g) if layer == skip_layer else None
        hook_out = f"blocks.{layer}.mlp.hook_out" if before_post_norm else f"blocks.{layer}.hook_mlp_out"
        out.append(check(Dictionary(
            Weights(W_enc, W_dec, b_dec, b_enc, W_skip), ActivationFunction(activation, threshold),
            binding=Binding(mlp_input_hook(model, layer, standardized), hook_out), name=f"tc{layer}",
        ), model))
    return out


def cross_layer(model: resid.Transformer, d_sae: int = 24, seed: int = 0) -> CrossLayerTranscoder:
    g = torch.Generator().manual_seed(seed)
    n, d = model.config.n_layers, model.config.d_model
    hook_in = "hook_mlp_in" if not model.config.pre_norms else "mlp.hook_in"
    return check(CrossLayerTranscoder(
        W_enc=torch.randn(n, d, d_sae, generator=g) / d**0.5, b_enc=-0.3 * torch.rand(n, d_sae, generator=g),
        W_dec=[torch.randn(d_sae, n - l, d, generator=g) / d_sae**0.5 for l in range(n)],
        b_dec=0.1 * torch.randn(n, d, generator=g), activation="relu", hook_in=hook_in, hook_out="hook_mlp_out",
        name="clt"), model)
