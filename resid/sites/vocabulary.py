"""The vocabulary of a run's addresses: the parts of a Site, the fields of the sublayer records (resid.records),
the terms an attribution has rows for, and which index selects in which field. The one list of them: a Site's parts
and fields (resid.sites.site), what a Capture may record (resid.capture) and TransformerLens's names
(resid.sites.transformerlens) all read it from here.

    GLOBAL_PARTS               the parts that belong to no layer (embeddings, global terms, logits)
    RESID_PARTS                the residual stream's sites of a layer
    SUBLAYERS                  the sublayers: attention, cross-attention (decoders of encoder-decoder models), MLP
    LAYER_PARTS, PARTS         the parts of a layer; every part
    ATTN_FIELDS / MLP_FIELDS   the record fields of an attention (or cross-attention) / MLP sublayer; the first,
                               "out", is the sublayer's write and a site's default field
    TERMS                      constants of an attribution per sublayer (biases carried to the logit), not tensors
    DICTIONARY_FIELDS          a learned dictionary's terms at the site it reads or reconstructs
    UNIT_FIELDS                the fields an index (head, kv_head, neuron, expert) selects in
    DEFAULT_FIELD              the field a unit means when none is given
    UNIT_OF                    the index that selects within a field (z -> head, k -> kv_head, post -> neuron)
"""

GLOBAL_PARTS = ("embed", "pos_embed", "type_embed", "embed_norm_bias", "final_bias", "logits")
RESID_PARTS = ("resid_pre", "resid_mid", "resid_cross", "resid_post")
SUBLAYERS = ("attn", "cross", "mlp")
LAYER_PARTS = (*RESID_PARTS, "layer", *SUBLAYERS)
PARTS = (*GLOBAL_PARTS, *LAYER_PARTS)
# Fields of the sublayer records (resid.records), readable and capturable; the first is the default.
# resid_norm_scale: post-LN models only, and always kept there (the stream needs it to be read). q_proj / k_proj
# (before q/k norms and rotary) are q / k in models with neither, and kept once; scores are the softmax's input.
# kv_latent, kv_norm_scale: latent attention (DeepSeek) only. router_logits, expert_weights, expert_out:
# mixture-of-experts MLPs only (pre and gate: dense MLPs only).
ATTN_FIELDS = ("out", "z", "q", "k", "v", "pattern", "scores", "q_proj", "k_proj", "normalized", "norm_scale",
               "post_norm_scale", "resid_norm_scale", "kv_latent", "kv_norm_scale")
MLP_FIELDS = ("out", "post", "pre", "gate", "expert_out", "expert_weights", "router_logits", "normalized",
              "norm_scale", "post_norm_scale", "resid_norm_scale")
# Terms of an attribution: constants the decomposition has rows for, not tensors of the run
# (b_Q / b_K: the constant of a head's query / key, the pre-norm's bias carried through W_Q / W_K plus b_Q / b_K: a
# term of QK attribution, resid.analyses.graphs.qk)
TERMS = {"attn": ("b_O", "post_norm_bias", "resid_norm_bias", "b_Q", "b_K"),
         "mlp": ("b_out", "post_norm_bias", "resid_norm_bias")}
TERMS["cross"] = TERMS["attn"]
# A learned dictionary at a residual site or a sublayer: the terms of what it reconstructs there
DICTIONARY_FIELDS = ("reconstruction", "error", "skip", "b_dec")
# Which fields an index selects in, and the field it means by default
UNIT_FIELDS = {"head": ("z", "q", "pattern", "scores", "q_proj"), "kv_head": ("k", "v", "k_proj"),
               "neuron": ("post", "pre", "gate"),
               "expert": ("expert_out", "expert_weights", "router_logits", "post")}
DEFAULT_FIELD = {"head": "z", "neuron": "post", "expert": "expert_out", "feature": "acts"}
# The index that selects within a field (an expert's post is selected by its neuron, as a dense MLP's)
UNIT_OF = {field: unit for unit in ("head", "kv_head", "neuron") for field in UNIT_FIELDS[unit]}


def of_part(part: str) -> tuple[str, ...]:
    """The record fields of a sublayer part: "attn" / "cross" (attention) or "mlp"."""
    return MLP_FIELDS if part == "mlp" else ATTN_FIELDS
