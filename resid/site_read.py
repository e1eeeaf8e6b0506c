"""The tensor a Site names in a ResidualStream (`ResidualStream.read`; `Run.read` applies the site's positions):
residual sites, embeddings, whole writes, fields of a sublayer's record, indexed by head / key-value head /
neuron / expert."""

from torch import Tensor

from resid.errors import ResidError
from resid.sites import RESID_PARTS, Site


def read_site(stream, site: Site) -> Tensor:  # stream: a resid.stream.ResidualStream
    """ResidualStream.read: the tensor at `site`, without its positions applied."""
    if site.stack is not None:
        raise ResidError(f"{site.label} is a site of an encoder-decoder model's encoder, not of this stream: read it "
                         "from the EncoderDecoder's run (run.read(site)).")
    if site.of_dictionary:
        raise ResidError(f"{site.label} belongs to a learned dictionary, not to the stream: run the model with "
                         "dictionaries=[...] and read it with run.read(site) (or run.dictionaries).")
    if site.is_term:
        raise ResidError(f"{site.label} is a term of an attribution (a constant carried to the logit), not a tensor "
                         "of the run.")
    if site.part in RESID_PARTS:
        value = {"resid_pre": stream.resid_pre, "resid_mid": stream.resid_mid, "resid_cross": stream.resid_cross,
                 "resid_post": stream.resid_post}[site.part](site.layer)
        if value is None:
            raise ResidError(f"{site.label} does not exist in this model (no resid_mid in parallel blocks, no "
                             "resid_cross without cross-attention).")
        return value
    if site.part in ("embed", "pos_embed", "type_embed"):
        value = getattr(stream, site.part)
        if value is None:
            raise ResidError(f"{site.label}: this model has no such embedding write.")
        return value
    if site.part == "layer":
        raise ResidError(f"{site.label} is a whole layer (several writes): read Site(l, 'attn') and Site(l, 'mlp').")
    record = getattr(stream._layer(site.layer), site.part)
    if record is None:
        raise ResidError(f"{site.label}: this model has no cross-attention.")
    tensor = getattr(record, site.what)
    if site.what == "pattern" and site.head is not None:  # [batch head pos key_pos]
        return tensor[:, site.head]
    if site.expert is not None:
        return tensor[:, :, site.expert, site.neuron] if site.neuron is not None else tensor[:, :, site.expert]
    return tensor if site.unit is None else tensor[:, :, site.unit]

