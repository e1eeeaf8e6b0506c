"""A Site checked against a model's config (`Site.resolve`): its layer and indices in range and made non-negative,
and parts the model has (cross-attention, resid_mid, positional and token-type embeddings, experts).

Encoder sites (Site(..., stack="encoder"), labels "encoder.layers[2].attn.head[1]") belong to encoder-decoder
models: a Transformer's config describes one stack and refuses them; resid.EncoderDecoder resolves them against
its encoder's config (`EncoderDecoder.resolve`).
"""

import dataclasses

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.sites import Site


def resolve(site: Site, config: ModelConfig) -> Site:
    """The site checked against the model, with its layer and indices made non-negative."""
    where = site.label
    if site.stack is not None:
        raise ResidError(f"{where} is a site of an encoder-decoder model's encoder, and this model has no encoder: "
                         "drop the 'encoder.' prefix (stack=), or run a resid.EncoderDecoder, which routes encoder "
                         "sites to its encoder.")
    return _resolve(site, config, where)


def resolve_encoder(site: Site, config: ModelConfig) -> Site:
    """An encoder site resolved against the encoder's config (its errors name it by its own label)."""
    return dataclasses.replace(_resolve(dataclasses.replace(site, stack=None), config, site.label), stack=site.stack)


def _resolve(site: Site, config: ModelConfig, where: str) -> Site:
    changes = {}
    if site.layer is not None:
        changes["layer"] = _index(site.layer, config.n_layers, "layer", where, "layers")
    _check_model(site, config, where)
    kv = config.n_kv_heads
    sizes = {"head": (config.n_heads, "heads"), "kv_head": (kv, "key/value heads"),
             "neuron": (config.d_mlp, "MLP neurons"), "expert": (config.n_experts, "experts")}
    for name, (size, noun) in sizes.items():
        if getattr(site, name) is not None:
            changes[name] = _index(getattr(site, name), size, name, where, noun)
    return dataclasses.replace(site, **changes)


def _check_model(site: Site, config: ModelConfig, where: str) -> None:
    part = site.part
    if part in ("cross", "resid_cross") and not config.cross_attention:
        raise ResidError(f"{where}: this model has no cross-attention (only decoders of encoder-decoder models "
                         "do); use 'attn' or 'mlp'.")
    if part == "resid_mid" and config.block == "parallel":
        raise ResidError(f"{where}: parallel blocks have no resid_mid (both sublayers read resid_pre).")
    if part == "pos_embed" and config.positions not in ("learned", "sinusoidal"):
        raise ResidError(f"{where}: this model has no positional embedding write (its positions are rotary).")
    if part == "type_embed" and not config.n_token_types:
        raise ResidError(f"{where}: this model has no token-type embedding.")
    experts = config.n_experts
    if site.expert is not None and not experts:
        raise ResidError(f"{where}: this model's MLPs are dense, not mixtures of experts. Drop expert=.")
    if experts and site.neuron is not None and site.expert is None:
        raise ResidError(f"{where}: layer {site.layer}'s MLP is a mixture of {experts} experts, each with its own "
                         f"neurons. Name the expert: Site({site.layer}, 'mlp', expert=e, neuron={site.neuron}).")


def _index(value: int, size: int, name: str, where: str, noun: str) -> int:
    if not -size <= value < size:
        raise ResidError(f"{where}: {name} {value} is out of range; the model has {size} {noun} (0..{size - 1}, or "
                         f"-{size}..-1).")
    return value % size
