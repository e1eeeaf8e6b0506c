"""Attribution patching (AtP; Nanda 2023, Syed et al. 2023): every site's patching effect estimated at once, from
one run of each prompt of a pair and one backward pass:

    effect(site) ~ (donor activation - base activation) . d metric / d activation     (at the base run)

summed over the site's positions; method="atp*" adds AtP*'s refinements (Kramár et al. 2024; see
resid.analyses.patching.effects): queries and keys through the exact new pattern, and GradDrop, one more backward pass
per layer (no more forward passes), whose estimate of each effect's size fills the `magnitude` column.

Sites match resid.analyses.patching.activation's labels, so `compare` can join an estimate with the exact effects:
"resid_pre" (layer x position; d/d resid_pre(l) is d/d of the write just before it, layers[l-1].mlp.out, or of
the embedding for layer 0: exact for models whose stream is a sum of writes, so post-LN models are refused),
"sublayer" (each attention / MLP write), "head" (each head's z), and each head's "q", "k", "v" (keys and values
per key/value head) and "pattern", and "feature" (with `dictionaries=`: each feature of the learned dictionaries
whose activation differs between the prompts of a pair, its gradient taken through the dictionary's splice;
resid.analyses.patching.features; magnitude is |estimate| for features under AtP* too).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from resid.analyses import site_words
from resid.analyses.checks import check_choice
from resid.analyses.distributed.driver import drive
from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.inputs import batch_size_for
from resid.analyses.metrics import metric_values
from resid.analyses.patching import atp_seq2seq as seq2seq_atp
from resid.analyses.patching import selection
from resid.analyses.patching.effects import Effects, captured, gates, nodes
from resid.analyses.patching.exact import COLUMNS
from resid.analyses.patching.features import WORD, atp_frame, patched_dictionaries, require
from resid.analyses.patching.pairs import (
    Align,
    Mapping,
    Pairs,
    PairsJob,
    PatchDirection,
    PromptPairs,
    n_prompts,
    pairs_of,
    prepare,
    scored,
)
from resid.analyses.patching.sources import PairSources, pair_sources
from resid.analyses.sweeps import seq2seq
from resid.analyses.sweeps.chunks import dictionaries_digest
from resid.capture import Capture
from resid.dictionaries.check import on_device
from resid.errors import ResidError, param
from resid.model import Inputs, Transformer
from resid.seq2seq import EncoderDecoder
from resid.sites import Site

ALL_SITES = ("resid_pre", "sublayer", "head", "q", "k", "v", "pattern", WORD)  # the words AtP estimates
Method = Literal["atp", "atp*"]


def atp(
    model: Transformer | EncoderDecoder,
    pairs: Pairs | Inputs,
    corrupt: Inputs | None = None,
    targets: Sequence[str | int] | str | int | None = None,
    baselines: Sequence[str | int] | str | int | None = None,
    sites: str | Sequence[Site | str] = "resid_pre",
    direction: PatchDirection = "denoise",
    metric: str | Callable | None = None,
    align: Align = None,
    dictionaries: Sequence = (),
    source: Inputs | None = None,
    corrupt_source: Inputs | None = None,
    method: Method = "atp",
    execution: Execution | None = None,
) -> pd.DataFrame:
    """AtP (or AtP*) estimates, on every pair of `pairs` (a patching.Pairs; the old separate arguments still work
    for one release, as patching.activation's), for every site of `sites` (words, Sites and labels, as
    patching.activation takes them: resid.analyses.patching.selection; ["resid_pre", "sublayer", "head"]
    estimates all three from the same backward pass), one row per (pair, site) with the columns of
    resid.analyses.patching.COLUMNS plus `method` and `magnitude`; patched_metric is the base run's metric plus the
    estimated effect (AtP*: with the query / key fix), magnitude the estimated size of the effect (AtP: |effect|;
    AtP*: GradDrop's). execution: how it runs (resid.analyses.Execution): chunks of pairs on the one driver, `out=`
    stores finished pairs (resumable), the same rows on every executor. source, corrupt_source: encoder-decoder
    models only, each clean / corrupt prompt's source (resid.analyses.patching.atp_seq2seq: AtP of the writes and
    heads of both stacks, sites "sublayer" and "head")."""
    given = pairs_of(pairs, "patching.atp", corrupt=corrupt, targets=targets, baselines=baselines, metric=metric,
                     align=align)
    execution = as_execution(execution)
    full, (model, sources) = model, pair_sources(model, source, corrupt_source, n_prompts(given.clean))
    if sources is not None:
        return _pairs_atp(full, sources, given, sites, direction, dictionaries, method, execution)
    dictionaries = patched_dictionaries(dictionaries, sites)
    check_choice(method, "method", ("atp", "atp*"))
    pairs, target_ids, baseline_ids, metric, label = prepare(model, given, direction)
    width = int(pairs.clean.tokens.lengths.max())
    kinds, named, every = _selected(sites, model.config, width)
    require(named, dictionaries)
    if "resid_pre" in kinds and model.config.post_ln:
        raise ResidError("AtP of resid_pre needs a stream that is a sum of writes; post-LN models norm it after each "
                         "write. Use sites=['sublayer', 'head'], or exact activation patching.")
    if "pattern" in kinds:
        pairs.require_same_positions(f"{param('sites', 'pattern')} (a pattern spans every key position)")
    base = "corrupt" if direction == "denoise" else "clean"
    size = batch_size_for(model, pairs.clean.tokens, execution.batch_size, backward=True)
    settings = dict(direction=direction, metric=label,
                    **({"dictionaries": dictionaries_digest(dictionaries)} if dictionaries else {}))
    job = AtPJob.of(pairs, base, target_ids, baseline_ids, metric, size.value, settings, sites=kinds, method=method,
                    dictionaries=dictionaries)
    df = drive(model, job, execution)
    if df is None or df.empty:
        return pd.DataFrame(columns=[*COLUMNS, "method", "magnitude"])
    # the rows `sites` names, in its order (a word's sites as resid.analyses.site_words lists them; the features of the
    # word "feature", known only from the runs, after them)
    order = {site.label: i for i, site in enumerate(named)}
    of_kinds = {site.label for kind in kinds if kind != WORD for site in site_words.expand(kind, model.config, width)}
    keep = df["site"].isin(order) | (~df["site"].isin(of_kinds) if WORD in every else False)
    df = df[keep].assign(_order=df["site"].map(order)).sort_values(["prompt_idx", "_order"], kind="stable")
    df = df.drop(columns="_order")
    df["method"] = method
    return scored(df, direction, label)[[*COLUMNS, "method", "magnitude"]].reset_index(drop=True)


def _selected(sites, config, width: int) -> tuple[list[str], list[Site], set[str]]:
    """(the kinds of sites to estimate, of ALL_SITES, in order; the Sites `sites` names, in order, the features of the
    word "feature" left out; the kinds named by a word, all of whose sites are kept)."""
    listed = {kind: site_words.expand(kind, config, width) for kind in ALL_SITES if kind != WORD}
    kind_of = {site.label: kind for kind, found in listed.items() for site in found}
    kinds: list[str] = []
    every: set[str] = set()

    def word(name: str) -> list[Site]:
        check_choice(name, "sites", ALL_SITES)
        every.add(name)
        kinds.extend([name] if name not in kinds else [])
        return [] if name == WORD else listed[name]

    def named(found: list) -> list[Site]:
        found = site_words.expand(found, config, width)
        for site in found:
            kind = WORD if site.of_dictionary else kind_of.get(site.label)
            if kind is None:
                raise ResidError(f"Attribution patching has no estimate for {site.label}: it estimates residual sites "
                                 f"at one position 0..{width - 1} (resid_pre), writes (sublayer), heads, their q, k, v "
                                 "and pattern, and features. Patch it exactly with patching.activation.")
            kinds.extend([kind] if kind not in kinds else [])
        return found

    return kinds, selection.expand(sites, word, named), every


def _pairs_atp(model: EncoderDecoder, sources: PairSources, given: Pairs, sites, direction, dictionaries, method,
               execution: Execution) -> pd.DataFrame:
    """AtP of an encoder-decoder model (resid.analyses.patching.atp_seq2seq)."""
    if dictionaries:
        raise ResidError(f"{param('dictionaries')} are not taken with encoder-decoder models yet.")
    seq2seq.in_process(execution.executor)
    pairs, target_ids, baseline_ids, metric, label = prepare(model.decoder, given, direction)
    width, source_width = int(pairs.clean.tokens.lengths.max()), int(sources.clean.tokens.lengths.max())
    chosen = seq2seq_atp.chosen(model, sites, method, pairs, width, source_width)
    sources.check(chosen)
    base = "corrupt" if direction == "denoise" else "clean"
    size = batch_size_for(model.decoder, pairs.clean.tokens, execution.batch_size, backward=True)
    every = range(len(pairs.clean))
    ids = (sources.clean.sequences(every), sources.corrupt.sequences(every), sources.clean.pad_token_id)
    job = seq2seq_atp.Seq2SeqAtPJob.of(pairs, base, target_ids, baseline_ids, metric, size.value,
                                       dict(direction=direction, metric=label), sites=chosen, sources=ids)
    df = drive(model, job, execution)
    if df is None or df.empty:
        return pd.DataFrame(columns=[*COLUMNS, "method", "magnitude"])
    order = {site.label: i for i, site in enumerate(chosen)}
    df = df.assign(_order=df["site"].map(order)).sort_values(["prompt_idx", "_order"], kind="stable")
    df = df.drop(columns="_order")
    df["method"] = method
    return scored(df, direction, label)[[*COLUMNS, "method", "magnitude"]].reset_index(drop=True)


@dataclass
class AtPJob(PairsJob):
    """The AtP (AtP*) rows of chunks of pairs."""

    sites: list[str] = field(default_factory=list)
    method: str = "atp"
    dictionaries: tuple = ()  # learned dictionaries whose features are sites (they travel with the job)

    name = "attribution patching"
    key = ("prompt_idx", "site")

    def signature(self) -> dict:
        return {"analysis": "patching.atp", "sites": self.sites, "method": self.method, **super().signature()}

    def rows(self, model: Transformer, pairs: PromptPairs, indices: list[int]) -> pd.DataFrame:
        kinds = [kind for kind in self.sites if kind != WORD]
        frames = [_chunk(model, pairs, self.base, indices, self.targets, self.baselines, self.metric, kinds,
                         self.method)] if kinds else []
        if WORD in self.sites:
            frames.append(_features(model, pairs, self.base, indices, self.targets, self.baselines, self.metric,
                                    on_device(self.dictionaries, model)))
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _features(model, pairs: PromptPairs, base, chunk, targets, baselines, metric, dictionaries) -> pd.DataFrame:
    t = torch.tensor([targets[i] for i in chunk], device=model.device)
    b = None if baselines is None else torch.tensor([baselines[i] for i in chunk], device=model.device)
    frame, value, donor_value = atp_frame(model, pairs, base, list(chunk), dictionaries, metric, t, b)
    rows = frame["prompt_idx"].map({prompt: row for row, prompt in enumerate(chunk)}).to_numpy(dtype=np.int64)
    frame["clean_metric"] = donor_value[rows] if base == "corrupt" else value[rows]
    frame["corrupt_metric"] = value[rows] if base == "corrupt" else donor_value[rows]
    return frame


def _chunk(model, pairs: PromptPairs, base, chunk, targets, baselines, metric, sites, method) -> pd.DataFrame:
    star = method == "atp*"
    donor = "clean" if base == "corrupt" else "corrupt"
    capture = Capture(attn={"out"} | captured(sites), mlp={"out"}, final_norm_scale=False)
    base_tokens, donor_tokens = pairs.batch(base, chunk), pairs.batch(donor, chunk)
    t = torch.tensor([targets[i] for i in chunk], device=model.device)
    b = None if baselines is None else torch.tensor([baselines[i] for i in chunk], device=model.device)
    with torch.no_grad():
        donor_run = model.run(donor_tokens, capture=capture, logits_at="last")
    open_, hooks = gates(model) if star else (None, [])
    run = model.run(base_tokens, capture=capture, interventions=hooks, logits_at="last", grad=True)
    value = metric_values(metric, run.logits[:, 0], t, b)
    donor_value = metric_values(metric, donor_run.logits[:, 0], t, b)
    at = pairs.mapping(base, chunk, base_tokens, donor_tokens)
    effects = Effects(model, run.stream, donor_run.stream, base_tokens, sites, fix_qk=star, at=at)
    wrt = nodes(run.stream, sites)

    def gradient() -> dict:
        return dict(zip(wrt, torch.autograd.grad(value.sum(), list(wrt.values()), retain_graph=star)))

    estimate = {site: e.detach() for site, e in effects(gradient()).items()}
    if star:
        n_layers = model.config.n_layers
        size = {site: torch.zeros_like(e) for site, e in estimate.items()}
        for layer in range(n_layers):
            open_.fill_(1)
            open_[layer] = 0
            for site, e in effects(gradient(), dropped=layer).items():
                size[site] += e.detach().abs()
        magnitude = {site: s / max(n_layers - 1, 1) for site, s in size.items()}
    else:
        magnitude = {site: e.abs() for site, e in estimate.items()}
    frame, (base_metric, donor_metric) = _rows(chunk, at, value.detach(), donor_value, estimate, magnitude)
    rows = frame["prompt_idx"].map({prompt: row for row, prompt in enumerate(chunk)}).to_numpy()
    base_metric, donor_metric = base_metric[rows], donor_metric[rows]
    frame["clean_metric"] = donor_metric if base == "corrupt" else base_metric
    frame["corrupt_metric"] = base_metric if base == "corrupt" else donor_metric
    return frame


def _rows(chunk, at: Mapping, value: Tensor, donor_value: Tensor, estimate: dict,
          magnitude: dict) -> tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray]]:
    """(one row per (pair, site), with the site columns, position, patched_metric and magnitude; the base and donor
    metrics of each pair, on the host). The residual stream is estimated at each aligned position, named by its
    position in the clean prompt. Every number comes to the host in one transfer: the estimates and magnitudes of
    the sites of a pair (all [batch]) as [2 sites batch], the residual ones picked at the aligned positions first."""
    resid = [site for site in estimate if site.part == "resid_pre"]
    other = [site for site in estimate if site.part != "resid_pre"]
    n, aligned = len(chunk), len(at.row_list)
    pieces = [value.double(), donor_value.double()]
    for of in (estimate, magnitude):
        if other:
            pieces.append(torch.stack([of[site].double() for site in other]).flatten())
        if resid:
            stacked = torch.stack([of[site] for site in resid])  # [sites batch pos]
            pieces.append(stacked[:, at.rows.to(stacked.device), at.base.to(stacked.device)].double().flatten())
    flat = torch.cat(pieces).cpu().numpy()
    base_metric, donor_metric = flat[:n], flat[n:2 * n]
    sizes = (len(other) * n, len(resid) * aligned)
    effect, size = np.split(flat[2 * n:], [sum(sizes)])
    other_effect, resid_effect = np.split(effect, [sizes[0]])
    other_size, resid_size = np.split(size, [sizes[0]])
    # the rows in the order of `estimate`: each site's pairs (a residual site's aligned positions)
    sites, prompts, patched, sizes_out = [], [], [], []
    rows = np.asarray(at.row_list, dtype=np.int64)
    chunk_array = np.asarray(chunk, dtype=np.int64)
    place = {site: i for i, site in enumerate(other)} | {site: i for i, site in enumerate(resid)}
    for site in estimate:
        i = place[site]
        if site.part == "resid_pre":
            sites += [Site(site.layer, "resid_pre", positions=(p,)) for p in at.clean]
            prompts.append(chunk_array[rows])
            span = slice(i * aligned, (i + 1) * aligned)
            patched.append(base_metric[rows] + resid_effect[span])
            sizes_out.append(resid_size[span])
            continue
        sites += [site] * n
        prompts.append(chunk_array)
        span = slice(i * n, (i + 1) * n)
        patched.append(base_metric + other_effect[span])
        sizes_out.append(other_size[span])
    frame = pd.DataFrame({
        "prompt_idx": np.concatenate(prompts) if prompts else np.zeros(0, dtype=np.int64),
        **site_words.columns(sites),
        "position": pd.array([site_words.position(site) for site in sites], dtype="Int64"),
        "patched_metric": np.concatenate(patched) if patched else np.zeros(0),
        "magnitude": np.concatenate(sizes_out) if sizes_out else np.zeros(0),
    })
    return frame, (base_metric, donor_metric)
