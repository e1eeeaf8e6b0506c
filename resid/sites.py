"""Sites: the one address of every place of a run that can be read, captured, edited or attributed to.

A `Site` is a frozen dataclass. Its `label` is its one printed form (every table's `site` column), and
`Site.parse(label)` gives the Site back. Grammar of a label (indices may be negative, counting from the end):

    embed | pos_embed | type_embed                  the embedding writes
    embed_norm_bias | final_bias                    terms of an attribution (post-LN embedding norm; final norm +
                                                    unembedding biases), not tensors of the run
    layers[L].resid_pre | resid_mid | resid_cross | resid_post      the residual stream itself
    layers[L]                                       the whole layer (its sublayer writes together)
    layers[L].attn | cross | mlp                    a sublayer's write (its `out`)
    layers[L].attn.head[H]                          query head H's z (it writes z[H] @ W_O[H])
    layers[L].attn.head[H].q | .pattern             that head's query (after rotary) or attention pattern
    layers[L].attn.kv_head[H].k | .v                key / value head H (shared by its query heads under GQA)
    layers[L].mlp.neuron[I]                         neuron I's coefficient post[I] (it writes post[I] * W_out[I])
    layers[L].mlp.neuron[I].pre | .gate             its key score / gate input
    layers[L].mlp.expert[E]                         expert E's weighted write (mixtures of experts)
    layers[L].mlp.expert[E].neuron[I]               expert E's post[I]
    layers[L].attn.FIELD                            any other field of the sublayer's record, whole: z, q, k, v,
                                                    pattern, normalized (its input after the norm), norm_scale, ...
    layers[L].attn.b_O | post_norm_bias | resid_norm_bias    terms of an attribution (mlp: b_out, ...)
    layers[L].resid_post.feature[F]                 feature F of the learned dictionary (resid.dictionaries) that
    layers[L].mlp.feature[F]                        reconstructs this site: its activation (it writes a_F * W_dec[F])
    layers[L].mlp.error | reconstruction | skip | b_dec     that dictionary's error term, reconstruction, skip path
                                                    (transcoders) and decoder bias (a term of an attribution)
    encoder.SITE                                    the same site in an encoder-decoder model's encoder (stack=
                                                    "encoder"; without the prefix, the decoder or the only stack)
    ...@P  or  ...@P,Q                              only these prompt-relative positions (0 = a prompt's first
                                                    real token, -1 its last, whatever the padding)

So `Site(3, "attn", head=5).label == "layers[3].attn.head[5]"` and `Site.parse("layers[3].resid_pre@-1") ==
Site(3, "resid_pre", positions=(-1,))`. Default fields (the write, z for a head, post for a neuron, expert_out
for an expert) are left out of labels, so each site has exactly one label.

`site.hook_name` is the TransformerLens hook the site reads (with its index, e.g. "blocks.3.attn.hook_z[:, :, 5]"
is written "blocks.3.attn.hook_z" plus `site.head`); `Site.from_hook_name("blocks.3.hook_resid_pre")` goes back.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import SupportsIndex

import numpy as np

from resid.config import ModelConfig
from resid.errors import ResidError

GLOBAL_PARTS = ("embed", "pos_embed", "type_embed", "embed_norm_bias", "final_bias")
RESID_PARTS = ("resid_pre", "resid_mid", "resid_cross", "resid_post")
SUBLAYERS = ("attn", "cross", "mlp")
LAYER_PARTS = (*RESID_PARTS, "layer", *SUBLAYERS)
PARTS = (*GLOBAL_PARTS, *LAYER_PARTS)
# Fields of the sublayer records (resid.records), readable and capturable; the first is the default
ATTN_FIELDS = ("out", "z", "q", "k", "v", "pattern", "normalized", "norm_scale", "post_norm_scale", "resid_norm_scale")
MLP_FIELDS = ("out", "post", "pre", "gate", "expert_out", "expert_weights", "router_logits", "normalized",
              "norm_scale", "post_norm_scale", "resid_norm_scale")
# Terms of an attribution: constants the decomposition has rows for, not tensors of the run
TERMS = {"attn": ("b_O", "post_norm_bias", "resid_norm_bias"), "mlp": ("b_out", "post_norm_bias", "resid_norm_bias")}
TERMS["cross"] = TERMS["attn"]
# Which fields an index selects in, and the field it means by default
UNIT_FIELDS = {"head": ("z", "q", "pattern"), "kv_head": ("k", "v"), "neuron": ("post", "pre", "gate"),
               "expert": ("expert_out", "expert_weights", "router_logits", "post")}
DEFAULT_FIELD = {"head": "z", "neuron": "post", "expert": "expert_out", "feature": "acts"}
# A learned dictionary at a residual site or a sublayer: the terms of what it reconstructs there
DICTIONARY_FIELDS = ("reconstruction", "error", "skip", "b_dec")


def _fields(part: str) -> tuple[str, ...]:
    return (*(MLP_FIELDS if part == "mlp" else ATTN_FIELDS), *TERMS[part], *DICTIONARY_FIELDS)


@dataclass(frozen=True)
class Site:
    """One address of a run; see the module docstring. Examples:

        Site(3, "resid_pre")                the residual entering layer 3    [batch pos d_model]
        Site(3, "attn")                     layer 3's attention write        [batch pos d_model]
        Site(3, "attn", head=5)             head 5's z                       [batch pos d_head]
        Site(3, "attn", head=5, field="q")  head 5's query                   [batch pos d_head]
        Site(3, "attn", head=5, field="pattern")  its pattern                [batch pos key_pos]
        Site(3, "attn", kv_head=1, field="k")     key head 1                 [batch pos d_head]
        Site(3, "mlp", neuron=42)           neuron 42's post                 [batch pos]
        Site(3, "mlp", expert=2)            expert 2's weighted write        [batch pos d_model]
        Site(3, "mlp", field="normalized")  the MLP's input after its norm   [batch pos d_model]
        Site(3, "layer")                    layer 3's writes together (ablation: both sublayers)
        Site(None, "embed")                 the token embedding write        [batch pos d_model]

    With positions=(...) the pos axis holds those prompt-relative positions, in the order given: e.g.
    Site(3, "mlp", positions=[-1]) edits or reads [batch 1 d_model], each prompt's last token."""

    # Indices are integers (numpy integers too: they are stored as int); bools and floats are refused.
    layer: SupportsIndex | None  # None for embeddings and the global terms; negative counts from the last layer
    part: str  # one of PARTS
    head: SupportsIndex | None = None  # query head (fields z, q, pattern)
    neuron: SupportsIndex | None = None  # MLP neuron (fields post, pre, gate)
    positions: Sequence[SupportsIndex] | None = None  # prompt-relative; None = every position
    expert: SupportsIndex | None = None  # mixture-of-experts expert (its write, or with neuron its post[i])
    field: str | None = None  # the record field; None = the default (the write, z of a head, post of a neuron)
    kv_head: SupportsIndex | None = None  # key/value head (fields k, v)
    feature: SupportsIndex | None = None  # a learned dictionary's feature at this site (resid.dictionaries)
    stack: str | None = None  # "encoder": an encoder-decoder model's encoder; None: the decoder, or the only stack

    def __post_init__(self) -> None:
        for name in ("layer", "head", "neuron", "expert", "kv_head", "feature"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _as_int(value, name))
        if self.stack == "decoder":  # one value per site: the decoder is the default stack
            object.__setattr__(self, "stack", None)
        if self.stack not in (None, "encoder"):
            raise ResidError(f"Site stack must be 'encoder' (or None: the decoder, or the only stack), got "
                             f"{self.stack!r}.")
        if self.part not in PARTS:
            raise ResidError(f"Site part must be one of {', '.join(PARTS)}; got {self.part!r}.")
        if self.part in GLOBAL_PARTS:
            if self.layer is not None:
                raise ResidError(f"Site part {self.part!r} belongs to no layer: write Site(None, {self.part!r}).")
        elif self.layer is None:
            raise ResidError(f"Site part {self.part!r} needs a layer: Site(3, {self.part!r}).")
        if self.feature is not None and self.feature < 0:
            raise ResidError(f"Site feature must be a feature index >= 0, got {self.feature}.")
        self._check_units()
        if self.field is not None and self.field == self._default_field():  # one value per site: defaults are None
            object.__setattr__(self, "field", None)
        if self.positions is not None:
            if isinstance(self.positions, (str, bytes)) or not isinstance(self.positions, Sequence):
                raise ResidError(f"Site positions must be a list of prompt-relative integers, got {self.positions!r}.")
            positions = tuple(_as_int(p, "positions") for p in self.positions)
            if not positions:
                raise ResidError("Site positions is empty: give at least one position, or None for every position.")
            object.__setattr__(self, "positions", positions)

    def _check_units(self) -> None:
        units = {name: getattr(self, name) for name in ("head", "kv_head", "neuron", "expert", "feature")}
        given = [name for name, value in units.items() if value is not None]
        where = f"Site({self.layer}, {self.part!r})"
        if self.feature is not None and (len(given) > 1 or self.field not in (None, "acts")):
            raise ResidError(f"{where}, feature={self.feature}: a dictionary's feature is a unit of its own (its "
                             "activation); drop the other indices and the field.")
        if self.part in RESID_PARTS and given in ([], ["feature"]) and self.field in (None, "acts",
                                                                                      *DICTIONARY_FIELDS):
            return  # the residual itself, or a dictionary's feature or term there
        if self.part not in SUBLAYERS:
            if given or self.field is not None:
                raise ResidError(f"{where} takes no {(given + ['field'])[0]}: heads and fields belong to 'attn' / "
                                 "'cross', neurons and experts to 'mlp'.")
            return
        allowed = ("head", "kv_head", "feature") if self.part != "mlp" else ("neuron", "expert", "feature")
        wrong = [name for name in given if name not in allowed]
        if wrong:
            raise ResidError(f"{where} cannot take {wrong[0]}: heads belong to 'attn' / 'cross', neurons and experts "
                             "to 'mlp'.")
        if self.head is not None and self.kv_head is not None:
            raise ResidError(f"{where}: give head= (a query head) or kv_head= (a key/value head), not both.")
        if self.field is not None and self.field not in _fields(self.part) and self.feature is None:
            raise ResidError(f"{where}: unknown field {self.field!r}; choose from {', '.join(_fields(self.part))}.")
        if self.kv_head is not None and self.field not in UNIT_FIELDS["kv_head"]:
            raise ResidError(f"{where}, kv_head={self.kv_head} needs field='k' or field='v' (queries and patterns "
                             "belong to query heads: head=).")
        for name in given:
            if name == "feature":
                continue
            if name == "expert" and self.neuron is not None:
                if self.field not in (None, "post"):
                    raise ResidError(f"{where}: an expert's neuron is its post[i]; drop field={self.field!r}.")
                continue
            if self.field is not None and self.field not in UNIT_FIELDS[name]:
                raise ResidError(f"{where}, {name}={units[name]}: field {self.field!r} has no {name} axis; choose "
                                 f"from {', '.join(UNIT_FIELDS[name])}.")

    # --- what the site is -------------------------------------------------------------------------------------
    @property
    def what(self) -> str:
        """The field the site addresses, defaults filled in: a record field ("out", "z", "post", ...), a term
        ("b_O", ...), "resid" for the residual stream, "write" for an embedding, "layer" or a global term."""
        if self.part in RESID_PARTS and self.feature is None:
            return "resid" if self.field is None else self.field
        if self.part not in SUBLAYERS and self.part not in RESID_PARTS:
            return "write" if self.part in ("embed", "pos_embed", "type_embed") else self.part
        return self.field if self.field is not None else self._default_field()

    def _default_field(self) -> str:
        for name in ("feature", "neuron", "head", "expert"):  # an expert's neuron is its post, like a dense neuron
            if getattr(self, name) is not None:
                return DEFAULT_FIELD[name]
        return "out"

    @property
    def is_term(self) -> bool:
        """A constant of an attribution (a bias carried to the logit), not a tensor of the run."""
        if self.part in ("embed_norm_bias", "final_bias") or (self.feature is None and self.what == "b_dec"):
            return True
        return self.part in TERMS and self.what in TERMS[self.part]

    @property
    def of_dictionary(self) -> bool:
        """A learned dictionary's feature or term (resid.dictionaries): read from run.dictionaries, not the stream."""
        return self.feature is not None or self.what in DICTIONARY_FIELDS

    @property
    def unit(self) -> int | None:
        """The index the site selects within its field (head, key/value head, neuron), or None."""
        for name in ("head", "kv_head", "neuron"):
            if getattr(self, name) is not None:
                return getattr(self, name)
        return None

    @property
    def whole(self) -> "Site":
        """The same site at every position."""
        return dataclasses.replace(self, positions=None) if self.positions is not None else self

    # --- the one printed form ---------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        if self.part in GLOBAL_PARTS:
            text = self.part
        elif self.part == "layer":
            text = f"layers[{self.layer}]"
        else:
            text = f"layers[{self.layer}].{self.part}"
            for name in ("expert", "head", "kv_head", "neuron", "feature"):
                if getattr(self, name) is not None:
                    text += f".{name}[{getattr(self, name)}]"
            if self.field is not None and self.field != self._default_field():
                text += f".{self.field}"
        if self.positions is not None:
            text += "@" + ",".join(str(p) for p in self.positions)
        return text if self.stack is None else f"{self.stack}.{text}"

    def __str__(self) -> str:
        return self.label

    @classmethod
    def parse(cls, text: str) -> "Site":
        """The Site of a label (see the module docstring), or of a TransformerLens hook name."""
        from resid.site_names import parse

        return parse(text)

    # --- TransformerLens names ---------------------------------------------------------------------------------
    @property
    def hook_name(self) -> str:
        """The TransformerLens hook this site reads (indexed by the site's head / neuron where it has one)."""
        from resid.site_names import hook_name

        return hook_name(self)

    @classmethod
    def from_hook_name(cls, name: str, index: int | None = None) -> "Site":
        """The Site a TransformerLens hook name reads; `index` picks a head (attn.hook_z / q / pattern), key/value
        head (hook_k / hook_v) or neuron (mlp.hook_post / hook_pre) within it (resid.site_names)."""
        from resid.site_names import site_of

        return site_of(name, index)

    # --- against a model ---------------------------------------------------------------------------------------
    def resolve(self, config: ModelConfig) -> "Site":
        """The site checked against the model, with its layer and indices made non-negative (resid.site_checks);
        encoder sites are resolved by their EncoderDecoder (resid.seq2seq), against its encoder's config."""
        from resid.site_checks import resolve

        return resolve(self, config)


def _as_int(value: object, name: str) -> int:
    """An index as an int: Python and numpy integers pass, bools and floats (even 3.0) are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ResidError(f"Site {name} must be an integer, got {value!r} ({type(value).__name__}).")
    return int(value)
