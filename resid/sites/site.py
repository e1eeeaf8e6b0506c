"""Sites: the one address of every place of a run that can be read, captured, edited or attributed to.

A `Site` is a frozen dataclass. Its `label` is its one printed form (every table's `site` column), and
`Site.parse(label)` gives the Site back. Grammar of a label (indices may be negative, counting from the end):

    embed | pos_embed | type_embed                  the embedding writes
    embed_norm_bias | final_bias                    terms of an attribution (post-LN embedding norm; final norm +
                                                    unembedding biases), not tensors of the run
    logits | logits.token[T]                        the run's logits, or one token's (a logit node of a graph)
    layers[L].resid_pre | resid_mid | resid_cross | resid_post      the residual stream itself
    layers[L]                                       the whole layer (its sublayer writes together)
    layers[L].attn | cross | mlp                    a sublayer's write (its `out`)
    layers[L].attn.head[H]                          query head H's z (it writes z[H] @ W_O[H])
    layers[L].attn.head[H].q | .pattern             that head's query (after q/k norm and rotary) or attention pattern
    layers[L].attn.head[H].scores                   that head's scores, the softmax's input (-inf where masked)
    layers[L].attn.head[H].q_proj                   that head's query as projected (before q/k norm and rotary)
    layers[L].attn.kv_head[H].k | .v | .k_proj      key / value head H (shared by its query heads under GQA); k_proj
                                                    its key before q/k norm and rotary
    layers[L].mlp.neuron[I]                         neuron I's coefficient post[I] (it writes post[I] * W_out[I])
    layers[L].mlp.neuron[I].pre | .gate             its key score / gate input
    layers[L].mlp.expert[E]                         expert E's weighted write (mixtures of experts)
    layers[L].mlp.expert[E].neuron[I]               expert E's post[I]
    layers[L].attn.FIELD                            any other field of the sublayer's record, whole: z, q, k, v,
                                                    pattern, normalized (its input after the norm), norm_scale,
                                                    kv_latent (latent attention's compressed keys and values), ...
    layers[L].attn.b_O | post_norm_bias | resid_norm_bias    terms of an attribution (mlp: b_out, ...); b_Q | b_K
                                                    the constant of a head's query / key (QK attribution)
    layers[L].resid_post.feature[F]                 feature F of the learned dictionary (resid.dictionaries) that
    layers[L].mlp.feature[F]                        reconstructs this site: its activation (it writes a_F * W_dec[F])
    layers[L].mlp.error | reconstruction | skip | b_dec     that dictionary's error term, reconstruction, skip path
                                                    (transcoders) and decoder bias (a term of an attribution)
    layers[L].mlp["NAME"].feature[F]                the same, naming the dictionary (JSON-quoted), for when two
                                                    dictionaries read or reconstruct one site
    encoder.SITE                                    the same site in an encoder-decoder model's encoder (stack=
                                                    "encoder"; without the prefix, the decoder or the only stack)
    ...@P  or  ...@P,Q                              only these prompt-relative positions (0 = a prompt's first
                                                    real token, -1 its last, whatever the padding)

So `Site(3, "attn", head=5).label == "layers[3].attn.head[5]"` and `Site.parse("layers[3].resid_pre@-1") ==
Site(3, "resid_pre", positions=(-1,))`. Default fields (the write, z for a head, post for a neuron, expert_out
for an expert) are left out of labels, so each site has exactly one label.

`site.hook_name` is the TransformerLens hook the site reads (with its index, e.g. "blocks.3.attn.hook_z[:, :, 5]"
is written "blocks.3.attn.hook_z" plus `site.head`); `Site.from_hook_name("blocks.3.hook_resid_pre")` goes back
(both from the one table of TransformerLens names, resid.sites.transformerlens). `site.resolve(config)` checks a
site against a model: its layer and indices in range (made non-negative) and parts the model has.
"""

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import SupportsIndex

import numpy as np

from resid.config import ModelConfig
from resid.errors import ResidError
from resid.sites import transformerlens, vocabulary
from resid.sites.vocabulary import (
    DEFAULT_FIELD,
    DICTIONARY_FIELDS,
    GLOBAL_PARTS,
    PARTS,
    RESID_PARTS,
    SUBLAYERS,
    TERMS,
    UNIT_FIELDS,
)


def _fields(part: str) -> tuple[str, ...]:
    return (*vocabulary.of_part(part), *TERMS[part], *DICTIONARY_FIELDS)


@dataclass(frozen=True)
class Site:
    """One address of a run; see the module docstring. Examples:

        Site(3, "resid_pre")                the residual entering layer 3    [batch pos d_model]
        Site(3, "attn")                     layer 3's attention write        [batch pos d_model]
        Site(3, "attn", head=5)             head 5's z                       [batch pos d_head]
        Site(3, "attn", head=5, field="q")  head 5's query                   [batch pos d_head]
        Site(3, "attn", head=5, field="pattern")  its pattern                [batch pos key_pos]
        Site(3, "attn", head=5, field="scores")   its pre-softmax scores     [batch pos key_pos]
        Site(3, "attn", kv_head=1, field="k")     key head 1                 [batch pos d_head]
        Site(3, "mlp", neuron=42)           neuron 42's post                 [batch pos]
        Site(3, "mlp", expert=2)            expert 2's weighted write        [batch pos d_model]
        Site(3, "mlp", field="normalized")  the MLP's input after its norm   [batch pos d_model]
        Site(3, "layer")                    layer 3's writes together (ablation: both sublayers)
        Site(None, "embed")                 the token embedding write        [batch pos d_model]
        Site(3, "mlp", feature=7)           feature 7 of the dictionary reconstructing layer 3's MLP write
        Site(3, "mlp", feature=7, dictionary="tc")  ... of the one named "tc", when several do
        Site(None, "logits", token=1234)    token 1234's logit               [batch pos]

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
    dictionary: str | None = None  # the name of the dictionary a feature or term belongs to; None: the only one
    token: SupportsIndex | None = None  # a vocabulary entry of the logits

    def __post_init__(self) -> None:
        for name in ("layer", "head", "neuron", "expert", "kv_head", "feature", "token"):
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
        for name in ("feature", "token"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ResidError(f"Site {name} must be a {name} index >= 0, got {getattr(self, name)}.")
        if self.token is not None and self.part != "logits":
            raise ResidError(f"Site(..., {self.part!r}, token={self.token}): a token indexes the logits, "
                             f"Site(None, 'logits', token={self.token}).")
        self._check_units()
        if self.field is not None and self.field == self._default_field():  # one value per site: defaults are None
            object.__setattr__(self, "field", None)
        if self.dictionary is not None and (not isinstance(self.dictionary, str) or not self.of_dictionary):
            raise ResidError(f"Site dictionary={self.dictionary!r} names the dictionary of a feature or of a "
                             "dictionary's term (error, reconstruction, skip, b_dec): give it with feature= or one "
                             "of those fields, as a string.")
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
            raise ResidError(f"{where}, kv_head={self.kv_head} needs field='k', 'v' or 'k_proj' (queries, scores and "
                             "patterns belong to query heads: head=).")
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
        ("b_O", ...), "resid" for the residual stream, "write" for an embedding, "layer", "logits" or a global
        term."""
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

    @property
    def reconstructed(self) -> "Site":
        """The site a dictionary's feature or term belongs to: the tensor the dictionary reads or reconstructs,
        at every position (Site(3, "mlp", feature=7) -> Site(3, "mlp"))."""
        return dataclasses.replace(self, feature=None, field=None, positions=None, dictionary=None)

    # --- the one printed form ---------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        if self.part in GLOBAL_PARTS:
            text = self.part if self.token is None else f"{self.part}.token[{self.token}]"
        elif self.part == "layer":
            text = f"layers[{self.layer}]"
        else:
            text = f"layers[{self.layer}].{self.part}"
            if self.dictionary is not None:
                text += f"[{json.dumps(self.dictionary, ensure_ascii=False)}]"
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
        if not isinstance(text, str):
            raise ResidError(f"Site.parse takes a site label such as 'layers[3].attn.head[5]', got {text!r}.")
        if text.startswith(("blocks.", "hook_", "ln_final.")):
            return cls.from_hook_name(text)
        if text.strip().startswith("encoder."):  # the encoder's stack of an encoder-decoder model
            return dataclasses.replace(cls.parse(text.strip().removeprefix("encoder.")), stack="encoder")
        body, _, at = text.strip().partition("@")
        positions = None
        if at:
            if not POSITIONS.fullmatch(at):
                raise ResidError(f"Site label {text!r}: positions after '@' must be integers like @-1 or @3,4.")
            positions = tuple(int(p) for p in at.split(","))
        match = GLOBAL.fullmatch(body)
        if match is not None:
            token = None if match["token"] is None else int(match["token"])
            return cls(None, match["part"], positions=positions, token=token)
        match = LABEL.fullmatch(body)
        if match is None:
            raise ResidError(f"{text!r} is not a site label: write e.g. 'layers[3].resid_pre', 'layers[3].attn', "
                             "'layers[3].attn.head[5]', 'layers[3].mlp.neuron[42]', 'embed' (resid.sites).")
        layer, part, units, field = match["layer"], match["part"], match["units"] or "", match["field"]
        found = dict((name, int(value)) for name, value in UNIT.findall(units))
        dictionary = None if match["dictionary"] is None else json.loads(match["dictionary"])
        return cls(int(layer), part or "layer", positions=positions, field=field, dictionary=dictionary, **found)

    # --- TransformerLens names (resid.sites.transformerlens) ---------------------------------------------------
    @property
    def hook_name(self) -> str:
        """The TransformerLens hook this site reads (indexed by the site's head / neuron where it has one)."""
        if self.of_dictionary:
            raise ResidError(f"{self.label} belongs to a learned dictionary, which TransformerLens has no hook for.")
        if self.stack is not None:
            raise ResidError(f"{self.label} is an encoder site, which resid gives no TransformerLens hook name.")
        field = None if self.what in ("resid", "out", "write") else self.what
        name = None if self.expert is not None else transformerlens.name_of(self.layer, self.part, field)
        if name is None:
            raise ResidError(f"{self.label} has no TransformerLens hook name (resid.sites.transformerlens lists "
                             "the names).")
        return name

    @classmethod
    def from_hook_name(cls, name: str, index: int | None = None) -> "Site":
        """The Site a TransformerLens hook name reads; `index` picks a head (attn.hook_z / q / pattern), key/value
        head (hook_k / hook_v) or neuron (mlp.hook_post / hook_pre) within it."""
        layer, rows = transformerlens.rows(name)
        rows = [row for row in rows if row.part is not None and row.reads == "record" and row.role == "view"]
        if not rows:
            raise ResidError(f"{name!r} is not a TransformerLens hook name resid maps to a site (the residual stream, "
                             "the sublayer writes, attn.hook_z/q/k/v/pattern, mlp.hook_post/pre); see "
                             "docs/hook_names.md.")
        row = rows[0]
        units = {} if index is None or row.unit is None else {row.unit: index}
        return cls(layer, row.part, field=row.field, **units)

    # --- against a model ---------------------------------------------------------------------------------------
    def resolve(self, config: ModelConfig, n_layers: int | None = None) -> "Site":
        """The site checked against the model, with its layer and indices made non-negative. `n_layers`: the
        layers a run has when it stopped early (stop_at_layer), so that -1 is its last; default the model's.
        Encoder sites are resolved by their EncoderDecoder (resid.seq2seq), against its encoder's config
        (`resolve_encoder`)."""
        if self.stack is not None:
            raise ResidError(f"{self.label} is a site of an encoder-decoder model's encoder, and this model has no "
                             "encoder: drop the 'encoder.' prefix (stack=), or run a resid.EncoderDecoder, which "
                             "routes encoder sites to its encoder.")
        return self._resolved(config, self.label, n_layers)

    def resolve_encoder(self, config: ModelConfig) -> "Site":
        """An encoder site resolved against the encoder's config (its errors name it by its own label)."""
        bare = dataclasses.replace(self, stack=None)._resolved(config, self.label)
        return dataclasses.replace(bare, stack=self.stack)

    def _resolved(self, config: ModelConfig, where: str, n_layers: int | None = None) -> "Site":
        changes = {}
        if self.layer is not None:
            noun = "layers" if n_layers is None else "layers in this run (stop_at_layer)"
            changes["layer"] = _index(self.layer, config.n_layers if n_layers is None else n_layers, "layer", where,
                                      noun)
        layer = changes.get("layer")
        self._check_model(config, where, layer)
        width = config.d_mlp if layer is None else config.mlp_width(layer)  # DeepSeek's dense layers: d_mlp_dense
        sizes = {"head": (config.n_heads, "heads"), "kv_head": (config.n_kv_heads, "key/value heads"),
                 "neuron": (width, "MLP neurons"), "expert": (config.n_experts, "experts"),
                 "token": (config.d_vocab, "tokens in its vocabulary")}
        for name, (size, noun) in sizes.items():
            if getattr(self, name) is not None:
                changes[name] = _index(getattr(self, name), size, name, where, noun)
        return dataclasses.replace(self, **changes)

    def _check_model(self, config: ModelConfig, where: str, layer: int | None) -> None:
        part = self.part
        if part in ("cross", "resid_cross") and not config.cross_attention:
            raise ResidError(f"{where}: this model has no cross-attention (only decoders of encoder-decoder models "
                             "do); use 'attn' or 'mlp'.")
        if part == "resid_mid" and config.block == "parallel":
            raise ResidError(f"{where}: parallel blocks have no resid_mid (both sublayers read resid_pre).")
        if part == "pos_embed" and config.positions not in ("learned", "sinusoidal"):
            raise ResidError(f"{where}: this model has no positional embedding write (its positions are rotary).")
        if part == "type_embed" and not config.n_token_types:
            raise ResidError(f"{where}: this model has no token-type embedding.")
        if part == "logits" and config.head == "none":
            raise ResidError(f"{where}: this model has no logits (an embedding model: read its final hidden state).")
        experts = config.n_experts if layer is None or config.has_experts(layer) else 0
        if self.expert is not None and not experts:
            which = ("this model's MLPs are" if not config.n_experts else
                     f"layer {layer}'s MLP is (the first {config.n_dense_layers} layers of this model are)")
            raise ResidError(f"{where}: {which} dense, not mixtures of experts. Drop expert=.")
        if experts and self.neuron is not None and self.expert is None:
            raise ResidError(f"{where}: layer {self.layer}'s MLP is a mixture of {experts} experts, each with its own "
                             f"neurons. Name the expert: Site({self.layer}, 'mlp', expert=e, neuron={self.neuron}).")


# The label grammar (the module docstring): an index has at most MAX_DIGITS digits, so that parsing a label never
# meets Python's limit on int() of long strings with a traceback.
MAX_DIGITS = 18
_INDEX = rf"-?\d{{1,{MAX_DIGITS}}}"
_NAME = r'"(?:[^"\\]|\\.)*"'  # a dictionary's name, JSON-quoted
GLOBAL = re.compile(rf"(?P<part>{'|'.join(GLOBAL_PARTS)})(?:\.token\[(?P<token>\d{{1,{MAX_DIGITS}}})\])?")
LABEL = re.compile(rf"layers\[(?P<layer>{_INDEX})\]"
                   rf"(?:\.(?P<part>{'|'.join((*RESID_PARTS, *SUBLAYERS))})(?:\[(?P<dictionary>{_NAME})\])?"
                   rf"(?P<units>(?:\.(?:head|kv_head|neuron|expert|feature)\[{_INDEX}\])*)"
                   r"(?:\.(?P<field>[a-zA-Z_]+))?)?")
UNIT = re.compile(rf"\.(head|kv_head|neuron|expert|feature)\[({_INDEX})\]")
POSITIONS = re.compile(rf"{_INDEX}(?:,{_INDEX})*")


def _as_int(value: object, name: str) -> int:
    """An index as an int: Python and numpy integers pass, bools and floats (even 3.0) are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ResidError(f"Site {name} must be an integer, got {value!r} ({type(value).__name__}).")
    return int(value)


def _index(value: int, size: int, name: str, where: str, noun: str) -> int:
    if not -size <= value < size:
        raise ResidError(f"{where}: {name} {value} is out of range; the model has {size} {noun} (0..{size - 1}, or "
                         f"-{size}..-1).")
    return value % size
