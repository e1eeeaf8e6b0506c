"""Direct attribution to the features of learned dictionaries: `attribution.direct(..., dictionaries=[...])`.

A dictionary reconstructs a tensor exactly once its error term is kept:

    target = sum_i a_i * W_dec[i] * s  +  (b_dec * s + t)  +  x @ W_skip  +  error

(s, t: the input normalization undone, s = 1 and t = 0 without one; W_skip: skip transcoders). Read through the
same frozen direction as the writes (resid.analyses.contributions), each term is a row:

    residual SAE at S (layers[L].resid_post, ...)  S is the sum of every write before it, so those writes' rows
                                                   are replaced by S's feature rows, b_dec and error
    SAE or transcoder on a sublayer's write        that sublayer's rows (its write, heads, neurons, biases) are
    (layers[L].attn / .mlp)                        replaced by feature rows, b_dec, skip and error
    SAE on attention's z (heads flattened)         the heads' rows are replaced: z = sum_i a_i W_dec[i] + b_dec
                                                   + error, each read through W_O (and the post-norm, frozen);
                                                   the output bias b_O keeps its row

Feature rows are `layers[L].resid_post.feature[F]` (the site the dictionary reconstructs, then the feature), one
per feature active at the attributed position; terms are `....b_dec`, `....skip`, `....error`. Their sum is the
replaced write's contribution, so all rows still sum to the logit. Post-LN models (BERT), whose direction changes
along the stream, are refused.
"""

import dataclasses

import pandas as pd
import torch
from torch import Tensor

from resid.analyses.contributions import Contributions, through_post_norm
from resid.capture import Capture
from resid.dictionaries import Dictionary
from resid.dictionaries.modes import unwrapped
from resid.errors import ResidError
from resid.readout import Direction
from resid.sites import RESID_PARTS, SUBLAYERS, Site

# Where a write lies in the stream: the embeddings first, then each layer's sublayers in order
_ORDER = {"attn": 0, "cross": 1, "mlp": 2}
_BOUNDARY = {"resid_pre": 0, "resid_mid": 1, "resid_cross": 2, "resid_post": 3}


def attributed_dictionaries(model, dictionaries) -> list[Dictionary]:
    """The dictionaries to attribute to (Observe / Splice unwrapped: attribution reads an unchanged run)."""
    found = unwrapped(dictionaries)
    if found and model.config.post_ln:
        raise ResidError(f"{model.name} is post-LN: its residual is normed after every write, which attribution to "
                         "dictionary features does not carry features through yet.")
    return found


def capture_with(capture: Capture, model) -> Capture:
    """What attribution to a z SAE needs beyond the sublayer level's capture: the attention's post-norm scale."""
    if not model.config.post_norms:
        return capture
    return dataclasses.replace(capture, attn=capture.attn | {"post_norm_scale"})


def feature_groups(model, run, direction: Direction,
                   groups: list[Contributions]) -> tuple[list[Contributions], list[Tensor | None]]:
    """`groups` (every component's contribution) with what each of the run's dictionaries reconstructs replaced by
    its feature and term rows, and each group's activations [batch m] (None for groups of no feature)."""
    records = list(run.dictionaries.values())
    residual = [e for e in records if e.dictionary.point_out.site.part in RESID_PARTS]
    if len(residual) > 1:
        raise ResidError("Direct attribution decomposes the final residual once, so it takes at most one dictionary "
                         f"on the residual stream; got {', '.join(e.name for e in residual)}.")
    replaced: dict[tuple, list] = {}  # the (layer, part) writes a dictionary replaces -> its groups
    cut = None  # a residual SAE replaces every write before its site
    for encoded in records:
        site = encoded.dictionary.point_out.site
        if site.part in RESID_PARTS:
            cut = _key(site.layer, None) + _BOUNDARY[site.part]
            new = dictionary_rows(encoded, Site(site.layer, site.part), direction.project, direction)
        elif site.part in SUBLAYERS and site.what == "out":
            new = dictionary_rows(encoded, Site(site.layer, site.part), direction.project, direction)
        elif site.part == "attn" and site.what == "z" and encoded.dictionary.point_out.heads_flat:
            new = z_dictionary_rows(model, run, encoded, direction, Site(site.layer, site.part))
        else:
            raise ResidError(f"Dictionary {encoded.name!r} reconstructs {site.label}, which is not a write into the "
                             "residual stream; direct attribution takes dictionaries on the residual, on a sublayer's "
                             "write (transcoders included) and on attention's z.")
        key = (site.layer, "resid" if site.part in RESID_PARTS else site.part)
        if key in replaced:
            raise ResidError(f"Two dictionaries reconstruct {site.label}; attribute to one at a time.")
        replaced[key] = new
    out, acts, done = [], [], set()
    for group in groups:
        where = _where(group.sites[0])
        if where is not None and cut is not None and where < cut:
            continue
        layer_part = (group.sites[0].layer, group.sites[0].part)
        if layer_part in replaced:  # the first of the sublayer's groups: its rows stand there
            done.add(layer_part)
            new = replaced.pop(layer_part)
            out += [g for g, _ in new]
            acts += [a for _, a in new]
        elif layer_part not in done:
            out.append(group)
            acts.append(None)
    clash = [key for key in replaced if key[1] != "resid" and cut is not None and _key(*key) < cut]
    if clash:
        raise ResidError(f"A dictionary on layer {clash[0][0]}'s {clash[0][1]} write lies before the residual "
                         "dictionary, which already decomposes that write; attribute to them separately.")
    for key in list(replaced):  # the residual dictionary's rows stand where the writes it replaces stood
        if key[1] == "resid":
            at = next((i for i, g in enumerate(out) if _where(g.sites[0]) is not None
                       or g.sites[0].part == "final_bias"), len(out))
            new = replaced.pop(key)
            out[at:at] = [g for g, _ in new]
            acts[at:at] = [a for _, a in new]
    return out, acts


def _key(layer: int | None, part: str | None) -> int:
    return -1 if layer is None else 3 * layer + (_ORDER[part] if part is not None else 0)


def _where(site: Site) -> int | None:
    """The stream position of a write's row (None for rows that are no write: final_bias)."""
    if site.part in ("embed", "pos_embed", "type_embed", "embed_norm_bias"):
        return -1
    if site.part in _ORDER:
        return _key(site.layer, site.part)
    return None


def dictionary_rows(encoded, at: Site, project, direction: Direction,
                    name: str | None = None) -> list[tuple[Contributions, Tensor | None]]:
    """Feature, b_dec, skip and error rows of a dictionary whose target is read with `direction` directly, at the
    sites of `at` (the site the dictionary reconstructs; `name`: the dictionary's, where several share it)."""
    acts, features, terms = dictionary_values(encoded, project, direction)
    return _feature_rows(at, acts, features, name) + _term_rows(at, terms, name)


def dictionary_values(encoded, project, direction: Direction) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """What dictionary_rows reads, on the device: the activations at the attributed position [batch feature], each
    feature's contribution [batch feature] and each term's {b_dec, skip, error: [batch]}."""
    d = encoded.dictionary
    scale, _ = encoded.output_scale()
    w_read = direction.through(d.W_dec)  # [batch pos feature]: W_dec[i] . u
    acts = encoded.acts.float()
    weighted = acts if scale is None else acts * scale.float()
    return acts.sum(1), (weighted * w_read).sum(1), _term_values(encoded, project)


def z_dictionary_rows(model, run, encoded, direction: Direction, at: Site,
                      name: str | None = None) -> list[tuple[Contributions, Tensor | None]]:
    """A z SAE's rows: z's terms read through W_O (per head, flattened like z) and the post-norm, plus b_O and the
    post-norm's bias (`at`, `name`: as for dictionary_rows)."""
    layer = encoded.dictionary.point_out.site.layer
    attn = model.blocks[layer].attn
    into, w_o, extra = _through_w_o(model, run, layer, direction)
    acts, features, terms = _z_values(encoded, w_o)
    rows = _feature_rows(at, acts, features, name) + _term_rows(at, terms, name)
    if attn.b_O is not None:
        rows.append((Contributions([Site(layer, "attn", field="b_O")], into.through(attn.b_O).sum(1)[:, None]), None))
    return rows + [(group, None) for group in extra]


def z_dictionary_values(model, run, encoded, direction: Direction) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """What z_dictionary_rows reads of z's terms (as dictionary_values; b_O and the post-norm's bias left out)."""
    return _z_values(encoded, _through_w_o(model, run, encoded.dictionary.point_out.site.layer, direction)[1])


def _through_w_o(model, run, layer: int, direction: Direction) -> tuple[Direction, Tensor, list[Contributions]]:
    """The direction before layer's attention post-norm, what z reads per z unit [batch pos (head d_head)], and the
    post-norm's own rows."""
    extra: list[Contributions] = []
    into = through_post_norm(model.blocks[layer].ln_attn_post, run.stream.layers[layer].attn, direction, layer,
                              "attn", extra)
    return into, into.through(model.blocks[layer].attn.W_O).flatten(-2), extra


def _z_values(encoded, w_o: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    acts = encoded.acts.float()
    features = (acts * (w_o @ encoded.dictionary.W_dec.float().T)).sum(1)

    def project(term: Tensor) -> Tensor:
        return (term.float() * w_o).sum((-1, 1))

    return acts.sum(1), features, _term_values(encoded, project)


def _feature_rows(at: Site, acts: Tensor, values: Tensor,
                  name: str | None) -> list[tuple[Contributions, Tensor | None]]:
    """One row per feature active at the attributed position of any prompt of the chunk (acts, values: [batch
    feature]; a prompt where it is not active gets 0; the frame drops those rows)."""
    active = torch.nonzero(acts.abs().sum(0)).flatten()
    sites = [dataclasses.replace(at, feature=int(i), dictionary=name) for i in active.tolist()]
    return [(Contributions(sites, values[:, active]), acts[:, active])]


def _term_values(encoded, project) -> dict[str, Tensor]:
    """Each term's contribution {b_dec, skip (with W_skip), error: [batch]}."""
    names = ["b_dec", *(["skip"] if encoded.dictionary.W_skip is not None else []), "error"]
    return {term: project(encoded.term(term)) for term in names}


def _term_rows(at: Site, terms: dict[str, Tensor], name: str | None) -> list[tuple[Contributions, Tensor | None]]:
    return [(Contributions([dataclasses.replace(at, field=term, dictionary=name)], value[:, None]), None)
            for term, value in terms.items()]


def with_features(table: pd.DataFrame, groups: list[Contributions], acts: list[Tensor | None]) -> pd.DataFrame:
    """The frame of `groups` (resid.analyses.contributions.frame) with a `feature` column (the feature id, <NA> on
    other rows) and an `activation` column (NaN on other rows), without the rows of features that are not active
    at a prompt's position."""
    batch = groups[0].values.shape[0]
    columns = [torch.full(g.values.shape, float("nan")) if a is None else a.detach().cpu().double()
               for g, a in zip(groups, acts, strict=True)]
    activation = torch.cat(columns, dim=1).double().reshape(-1).numpy()
    features = [site.feature for g in groups for site in g.sites] * batch
    table = table.assign(feature=pd.array(features, dtype="Int64"), activation=activation)
    inactive = table["feature"].notna().to_numpy() & (activation == 0)
    return table[~inactive].reset_index(drop=True)
