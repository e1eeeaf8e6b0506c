"""Random dictionaries for the tiny test models: SAEs and transcoders at the hooks every family has, sparse enough
that most activations are zero, checked against the model (so their hook points are resolved)."""

import torch

import resid
from resid.dictionaries import ActivationFunction, Binding, Dictionary, Weights, check
from resid.dictionaries.hooks import hook_point, width


def random_dictionary(model: resid.Transformer, hook_in: str, hook_out: str | None = None, d_sae: int = 40,
                      activation: str = "relu", skip: bool = False, seed: int = 0, name: str | None = None,
                      **options) -> Dictionary:
    """A random dictionary reading `hook_in` (and reconstructing `hook_out`: a transcoder), checked against
    `model`. The encoder's bias is negative so that about a third of the features fire."""
    g = torch.Generator().manual_seed(seed)
    config = model.config
    d_in = width(hook_point(hook_in, config), config)
    d_out = width(hook_point(hook_out or hook_in, config), config)
    threshold = torch.rand(d_sae, generator=g) * 0.2 if activation == "jumprelu" else None
    W_enc = torch.randn(d_in, d_sae, generator=g) / d_in**0.5
    b_enc = -0.3 * torch.rand(d_sae, generator=g)
    W_dec = torch.randn(d_sae, d_out, generator=g) / d_sae**0.5
    b_dec = 0.1 * torch.randn(d_out, generator=g)
    W_skip = 0.1 * torch.randn(d_in, d_out, generator=g) if skip else None
    dictionary = Dictionary(
        Weights(W_enc, W_dec, b_dec, b_enc, W_skip),
        ActivationFunction(activation, threshold, 5 if activation == "topk" else None),
        binding=Binding(hook_in, hook_out or hook_in), name=name or f"{hook_in}/{seed}", **options,
    )
    return check(dictionary, model)


def standard_set(model: resid.Transformer) -> list[Dictionary]:
    """An SAE on the residual stream, on the attention write, on z (heads flattened) and on the MLP write, and a
    skip transcoder from the MLP's input (its standardized input where the model has pre-norms) to its write."""
    config = model.config
    mlp_in = "blocks.1.ln2.hook_normalized" if config.pre_norms else "blocks.1.hook_mlp_in"
    return [
        random_dictionary(model, "blocks.0.hook_resid_post", seed=1),
        random_dictionary(model, "blocks.1.hook_resid_pre", activation="jumprelu", seed=2),
        random_dictionary(model, "blocks.0.hook_attn_out", activation="topk", seed=3),
        random_dictionary(model, "blocks.1.attn.hook_z", seed=4),
        random_dictionary(model, "blocks.0.hook_mlp_out", seed=5),
        random_dictionary(model, mlp_in, "blocks.1.hook_mlp_out", skip=True, seed=6),
    ]
