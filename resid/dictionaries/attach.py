"""Dictionaries in a run: `model.run(inputs, dictionaries=[sae, Splice(transcoder), ...])`.

Each dictionary reads the tensor its hook means (its HookPoint, resid.dictionaries.hooks) and records, as an
`Encoded` (resid.dictionaries.encoded), its feature activations [batch pos feature], its reconstruction and its
error term (the tensor it reconstructs minus the reconstruction). Modes:

    observe        a Dictionary, or Observe(d): the model runs unchanged (its logits are a plain run's, bit for
                   bit); the dictionary is applied to the run's records after the pass
    Splice(d)      inside the pass, the tensor d reconstructs is replaced by reconstruction + error: equal to the
                   clean run to float32 rounding, but now a sum of feature writes, a bias, the skip path and the
                   error, which attribution to features decomposes
    Splice(d, error=False)   replaced by the reconstruction alone: later layers see only what d keeps, so the
                   logits show what it loses

A transcoder reads site_in (e.g. the MLP's normalized input) and reconstructs site_out (the MLP's write):
splicing it replaces the MLP's write. A splice at a residual site is an edit of the residual, so the stream
records what it added (new - old) like any residual intervention; a spliced transcoder reading a residual site
records a zero there (the pass reads the residual through an identity edit).

A splice reading the norm's standardized output (TransformerLens's ln2.hook_normalized, before the gain) gets
the sublayer's normalized input and undoes the gain and bias, (normalized - b) / g in float32: the standardized
input to float32 rounding (a gain with a zero entry cannot be undone: such a splice is refused). Observing reads
the standardized input exactly (resid.dictionaries.hooks.read).

`Splice(d, edit=fn)` edits the activations inside the pass (fn(acts, tokens) -> acts) and writes the tensor plus
what the edit changed in the reconstruction, decode(edited) - decode(acts): decode(edited) + error, computed so
that a row the edit leaves alone keeps its tensor exactly. The feature interventions of resid.dictionaries.edits
(ZeroAblate(Site(3, "resid_post", feature=12)), ...) are such splices.

No host synchronisation per dictionary: encoding, decoding and splicing only queue work on the model's device, and
the one value a batch reads back is the count of every dictionary's non-zero activations, read together when the
records are stored (resid.dictionaries.encoded.store). Decoding is the dense product acts @ W_dec on every device:
on a GPU it never synchronises and its matrix units make it the fastest; on the CPU it was measured faster too
(2 cores, 512 tokens x 16,384 features, 0.4% active: 110 ms dense against 250 ms for the gathered decode of the
active features' rows and 130 ms for a CSR product; the dense product's cost does not grow with the density).
"""

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from resid.attachments import register
from resid.capture import Capture
from resid.dictionaries.check import ensure
from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.crosslayer_run import SplicedCLT, observed
from resid.dictionaries.dictionary import Dictionary, product
from resid.dictionaries.edits import feature_splices
from resid.dictionaries.encoded import (
    STORAGES,
    CrossLayerEncoded,
    Encoded,
    Recorded,
    at_real_tokens,
    real_tokens,
    store,
)
from resid.dictionaries.hooks import HookPoint, read
from resid.dictionaries.modes import Observe, Splice
from resid.errors import ResidError
from resid.interventions import Hook, Intervention
from resid.sites import RESID_PARTS


class Attached:
    """The dictionaries of one `model.run`: the capture they need, the hooks that splice, and the records."""

    def __init__(self, model, dictionaries: Sequence[Dictionary | CrossLayerTranscoder | Observe | Splice],
                 grad: bool = False):
        self.model, self.grad = model, grad
        self.uses = [_use(item, model) for item in dictionaries]
        _refuse_uninvertible(self.uses, model)
        names = [use.dictionary.name for use in self.uses]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ResidError(f"Two dictionaries of one run are named {twice[0]!r}: run.dictionaries finds them by "
                             "name, so give each its own (dictionary.name = '...').")
        self._inputs: dict[str, Tensor] = {}  # a spliced transcoder's input, read earlier in the pass
        self._found: dict[str, tuple[Tensor, Tensor, Tensor, Tensor]] = {}  # name -> (acts, recon, error, input)
        self._clts: dict[str, SplicedCLT] = {}  # the spliced cross-layer transcoders' state during the pass

    def capture(self, capture: Capture) -> Capture:
        """`capture` plus the fields the observed dictionaries read."""
        fields = {part: set(capture.fields(part)) for part in ("attn", "mlp", "cross")}
        layers = set(capture.layers) if capture.layers is not None else None
        embed = capture.embed
        for use in self.uses:
            if isinstance(use, Splice):
                continue
            for point in _points(use.dictionary):
                site = point.site
                if site.part in fields:
                    fields[site.part].add(site.what)
                    if point.standardized:
                        fields[site.part].add("norm_scale")
                if site.part in RESID_PARTS:  # the stream there is the sum of the writes before it
                    embed = True
                    for part in ("attn", "mlp", "cross") if self.model.config.cross_attention else ("attn", "mlp"):
                        fields[part].add("out")
                if layers is not None and site.layer is not None:
                    layers.update(range(site.layer + 1) if site.part in RESID_PARTS else (site.layer,))
        return dataclasses.replace(capture, **{part: frozenset(found) for part, found in fields.items()},
                                   layers=None if layers is None else tuple(sorted(layers)), embed=embed)

    def interventions(self, interventions: Sequence) -> list:
        """`interventions` with those on the dictionaries' features made into splices (resid.dictionaries.edits),
        then the splices of the spliced dictionaries."""
        return [*feature_edits(self.model, [use.dictionary for use in self.uses], interventions), *self.hooks()]

    def hooks(self) -> list[Hook]:
        """The interventions that splice (none for observed dictionaries)."""
        hooks = []
        for use in self.uses:
            if not isinstance(use, Splice):
                continue
            d = use.dictionary
            if isinstance(d, CrossLayerTranscoder):
                self._clts[d.name] = SplicedCLT(d, use.error, self.model)
                hooks += self._clts[d.name].hooks()
                continue
            if d.is_transcoder:
                hooks.append(Hook(d.point_in.site, self._tap(d)))
            hooks.append(Hook(d.point_out.site, self._splice(use)))
        return hooks

    def finish(self, run):
        """The run with `run.dictionaries` filled in."""
        with torch.set_grad_enabled(self.grad):
            return self._finish(run)

    def _finish(self, run):
        residuals = self._residuals(run)
        records = {}
        for use in self.uses:
            d = use.dictionary
            if isinstance(d, CrossLayerTranscoder):
                records[d.name] = self._clts.pop(d.name).record(lambda t: _kept(t, run.stream.captured)) \
                    if isinstance(use, Splice) else observed(d, run, self.model)
                continue
            if isinstance(use, Splice):
                acts, recon, error, x = (_kept(t, run.stream.captured) for t in self._found.pop(d.name))
                mode = "splice" if use.error else "reconstruction"
            else:
                x = residuals.get(d.point_in.site) if d.point_in.site in residuals else read(run, self.model,
                                                                                            d.point_in)
                target = x if not d.is_transcoder else read(run, self.model, d.point_out)
                acts = at_real_tokens(d.encode(x), real_tokens(run))
                recon = d.decode(acts, x)
                error, mode = target - recon, "observe"
            records[d.name] = Encoded(d, acts, recon, error, x, mode)
        return dataclasses.replace(run, dictionaries=Recorded(_stored(records, self.uses)))

    def _residuals(self, run) -> dict:
        """The residual sites the observed dictionaries read, in one walk of the stream (reading each alone would
        walk it once per dictionary)."""
        wanted = {use.dictionary.point_in.site for use in self.uses if not isinstance(use, Splice)
                  and not isinstance(use.dictionary, CrossLayerTranscoder)
                  and use.dictionary.point_in.site.part in RESID_PARTS and not use.dictionary.point_in.standardized}
        if len(wanted) < 2:
            return {}
        found = {}
        for site, resid in run.stream.running("sublayer"):
            if site in wanted:
                found[site] = resid
            after = dataclasses.replace(site, layer=site.layer + 1, part="resid_pre")
            if site.part == "resid_post" and after in wanted:
                found.setdefault(after, resid)  # an unedited resid_pre is the resid_post before it
        return found

    # --- inside the pass -------------------------------------------------------------------------------------
    def _tap(self, d: Dictionary) -> Callable:
        def tap(value: Tensor, tokens) -> Tensor:
            self._inputs[d.name] = d.point_in.view(value, self.model)
            return value

        return tap

    def _splice(self, use: Splice) -> Callable:
        d = use.dictionary

        def splice(value: Tensor, tokens) -> Tensor:
            target = d.point_out.view(value, self.model)
            x = self._inputs.pop(d.name) if d.is_transcoder else target
            acts = at_real_tokens(d.encode(x), tokens.attention_mask)
            recon = d.decode(acts, x)
            error = target - recon
            new = recon + error if use.error else recon
            if use.edit is not None:
                edited = use.edit(acts, tokens)
                change = write_of(d, edited - acts, x)  # exactly zero where the edit changed nothing
                acts, recon = edited, recon + change
                new = target + change if use.error else recon
            self._found[d.name] = (acts, recon, error, x)
            return d.point_out.unview(new, value, self.model)

        return splice


def _use(item, model) -> Observe | Splice:
    use = item if isinstance(item, (Observe, Splice)) else Observe(item)
    d = use.dictionary
    if not isinstance(d, (Dictionary, CrossLayerTranscoder)):
        raise ResidError(f"dictionaries= takes resid.dictionaries.Dictionary or CrossLayerTranscoder values (or "
                         f"Observe / Splice of one), got {type(d).__name__}.")
    if d.W_enc.device != model.device:
        raise ResidError(f"Dictionary {d.name!r} is on {d.W_enc.device} and the model on {model.device}: move it "
                         "there first (dictionary.to(model.device)); resid.dictionaries.load(path, model) puts it "
                         "on the model's device.")
    if isinstance(use, Splice) and use.edit is not None and isinstance(d, CrossLayerTranscoder):
        raise ResidError(f"Cross-layer transcoder {d.name!r}: Splice(edit=...) edits per-layer dictionaries only.")
    if use.storage not in STORAGES:
        raise ResidError(f"storage must be one of {', '.join(STORAGES)}, got {use.storage!r}.")
    d = ensure(d, model)  # loaded without a model, or checked against another: its widths and sites for this one
    for point in _points(d):
        if point.before_post_norm:
            raise ResidError(f"Dictionary {d.name!r} reads {point.name!r}, {point.site.label} before its post-norm, "
                             "which resid does not record (it records the write after the post-norm).")
    return use if d is use.dictionary else dataclasses.replace(use, dictionary=d)


def _refuse_uninvertible(uses: list[Observe | Splice], model) -> None:
    """Refuse a splice reading a standardized input whose norm gain has a zero entry (it cannot be recovered), with
    one host reading for all the splices of a run."""
    points = [(use.dictionary, point) for use in uses if isinstance(use, Splice) for point in
              (_points(use.dictionary)[:1] if isinstance(use.dictionary, Dictionary) else use.dictionary.points_in)
              if point.standardized]
    if not points:
        return
    # norm.invertible, for every norm at once: the effective gain (w + offset, in w's dtype) is zero exactly where
    # its float32 value is, since a rounded sum is zero only when the exact sum is
    invertible = torch.stack([(point.norm(model).gain != 0).all() for _, point in points]).tolist()
    for (d, point), ok in zip(points, invertible):
        if not ok:
            raise ResidError(f"Dictionary {d.name!r} reads the standardized input of {point.site.label}, whose "
                             "norm gain has a zero entry, so a splice cannot recover it; observe it instead.")


def _points(d: Dictionary | CrossLayerTranscoder) -> tuple[HookPoint, ...]:
    if isinstance(d, CrossLayerTranscoder):
        return (*d.points_in, *d.points_out)
    return (d.point_in,) if not d.is_transcoder else (d.point_in, d.point_out)


def _stored(records: dict[str, Encoded | CrossLayerEncoded], uses: list[Observe | Splice]
            ) -> dict[str, Encoded | CrossLayerEncoded]:
    """The records with their activations as each use's storage keeps them, all converted with one host reading."""
    storages = {use.dictionary.name: use.storage for use in uses}
    dense = [(name, a) for name, e in records.items()
             for a in (e.stored if isinstance(e, CrossLayerEncoded) else (e.stored,))]
    kept = iter(store([a for _, a in dense], [storages[name] for name, _ in dense]))
    return {name: dataclasses.replace(e, stored=tuple(next(kept) for _ in e.stored) if isinstance(e, CrossLayerEncoded)
                                      else next(kept)) for name, e in records.items()}


def _kept(tensor: Tensor, captured: Tensor | None) -> Tensor:
    """A pass's [batch pos ...] tensor at the run's captured positions ([batch k] padded indices, None: all)."""
    if captured is None:
        return tensor
    index = captured.to(tensor.device)
    return tensor.gather(1, index.view(*index.shape, 1).expand(-1, -1, tensor.shape[-1]))


register((Dictionary, CrossLayerTranscoder, Observe, Splice), Attached)


def write_of(d: Dictionary, delta: Tensor, x: Tensor) -> Tensor:
    """What a change of the activations changes in the reconstruction: delta @ W_dec, the input normalization
    undone (b_dec and the skip path do not change)."""
    out = product(delta, d.W_dec)
    if d.normalize_activations != "none":
        _, scale, shift = d._normalize(x)
        out = out / scale if shift is None else out * scale
    return out.to(delta.dtype)


def feature_edits(model, dictionaries: Sequence, interventions: Sequence[Intervention]) -> list[Intervention]:
    """`interventions` with those on dictionary features made into the Hooks of splices that apply them
    (resid.dictionaries.edits); `model.run(dictionaries=[...], interventions=[...])` calls it, and so can any
    code that runs the model with interventions (the sweep engine, resid.analyses.sweeps, for `model.resume`)."""
    plain, splices = feature_splices(model, dictionaries, interventions)
    return plain + Attached(model, splices).hooks() if splices else list(interventions)


__all__ = ["Attached", "Observe", "Splice", "feature_edits"]
