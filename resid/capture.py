"""Capture: what `model.run` records into the ResidualStream, so memory stays bounded.

The default records only the residual writes (embeddings, every sublayer's `out`, the final norm scale):
enough for resid_pre/mid/post, `final()` and `components()`. Add fields per sublayer, restrict layers or
positions to keep a large sweep in memory. A field that was not captured raises an error naming the option.
"""

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from resid.errors import ResidError
from resid.sites import Site, vocabulary

# The fields a Capture may keep of each sublayer (resid.sites.vocabulary, which says which models have which)
ATTN_FIELDS: frozenset[str] = frozenset(vocabulary.ATTN_FIELDS)
MLP_FIELDS: frozenset[str] = frozenset(vocabulary.MLP_FIELDS)


@dataclass(frozen=True)
class Capture:
    # Any collection is accepted and stored as a tuple / frozenset.
    layers: Sequence[int] | None = None  # layers whose records are kept; None = all
    # prompt-relative positions kept (-1: each prompt's last), the same for every prompt or one list per prompt
    # (each of the same length); None = all
    positions: Sequence[int] | Sequence[Sequence[int]] | None = None
    attn: Collection[str] = frozenset({"out"})  # subset of ATTN_FIELDS
    mlp: Collection[str] = frozenset({"out"})  # subset of MLP_FIELDS
    cross: Collection[str] = frozenset({"out"})  # subset of ATTN_FIELDS: decoders' cross-attention (enc-dec models)
    embed: bool = True  # the embedding write(s): embed and pos_embed
    final_norm_scale: bool = True  # the final norm's 1/sigma (or 1/rms), frozen for attribution

    def __post_init__(self) -> None:
        for name, allowed in (("attn", ATTN_FIELDS), ("mlp", MLP_FIELDS), ("cross", ATTN_FIELDS)):
            value = getattr(self, name)
            if isinstance(value, str):
                value = {value}
            value = frozenset(value)
            unknown = value - allowed
            if unknown:
                raise ResidError(
                    f"Capture({name}=...) got unknown field(s) {sorted(unknown)}; choose from {sorted(allowed)}."
                )
            object.__setattr__(self, name, value)
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(v) for v in self.layers))
        if self.positions is not None:
            per_prompt = bool(self.positions) and isinstance(self.positions[0], (list, tuple))
            value = tuple(tuple(int(v) for v in row) for row in self.positions) if per_prompt else tuple(
                int(v) for v in self.positions
            )
            object.__setattr__(self, "positions", value)

    @classmethod
    def all(cls) -> "Capture":
        """Everything, at every layer and position."""
        return cls(attn=ATTN_FIELDS, mlp=MLP_FIELDS, cross=ATTN_FIELDS)

    @classmethod
    def none(cls) -> "Capture":
        """Nothing but the logits: the fastest run."""
        return cls(attn=frozenset(), mlp=frozenset(), cross=frozenset(), embed=False, final_norm_scale=False)

    @classmethod
    def of(cls, sites: Iterable[Site], **options) -> "Capture":
        """The default capture (the residual writes, so every residual site can be read) plus each sublayer
        field the sites read (a head's z, a neuron's post, q / k / v / pattern, ...); `options` as for Capture
        (layers, positions, embed, ...)."""
        fields: dict[str, set[str]] = {part: {"out"} for part in vocabulary.SUBLAYERS}
        for site in sites:
            if site.part in fields and not site.is_term and not site.of_dictionary:
                fields[site.part].add(site.what)
        return cls(**{part: frozenset(found) for part, found in fields.items()}, **options)

    def fields(self, part: str) -> frozenset[str]:
        """The fields kept of a sublayer: "attn", "cross" or "mlp"."""
        return getattr(self, part)

    def keeps_layer(self, layer: int, n_layers: int) -> bool:
        return self.layers is None or layer in {l % n_layers for l in self.layers}

    def validate(self, n_layers: int) -> None:
        """Layers are checked here; positions against each prompt by Tokens.padded_index."""
        if self.layers is not None:
            bad = [l for l in self.layers if not -n_layers <= l < n_layers]
            if bad:
                raise ResidError(
                    f"Capture(layers=...) has {bad} out of range: the model has {n_layers} layers (0..{n_layers - 1})."
                )
