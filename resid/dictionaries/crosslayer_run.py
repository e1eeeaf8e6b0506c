"""A cross-layer transcoder in a run: `model.run(inputs, dictionaries=[clt])` or `[Splice(clt)]`
(resid.dictionaries.attach calls this module for a resid.dictionaries.CrossLayerTranscoder).

A CLT reads every layer's MLP input x[l] (its points_in) and reconstructs every layer's MLP write from the features
of that layer and all earlier ones (its points_out):

    a[l]   = encode_layer(l, x[l])
    x^[t]  = sum over l <= t of a[l] @ W_dec[l][:, t - l] + b_dec[t] (+ x[t] @ W_skip[t])
    error[t] = MLP write[t] - x^[t]

observe        the model runs unchanged; the CLT is applied to the run's records afterwards
Splice(clt)    inside the pass each layer's MLP write is replaced by x^[t] + error[t] (the clean run to float32
               rounding, now a sum of feature writes from every layer up to t, b_dec, the skip path and the error)
Splice(clt, error=False)  by x^[t] alone: later layers read only what the CLT reconstructs, and since layer t's
               features read the spliced stream, the errors of earlier layers are gone from their inputs too

`run.dictionaries[clt.name]` is a CrossLayerEncoded: per layer its activations, reconstruction, error and input,
and `written(source, target)`, what source layer's features write into target layer's MLP write.
"""

import torch
from torch import Tensor

from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.encoded import CrossLayerEncoded, at_real_tokens, real_tokens
from resid.dictionaries.hooks import read
from resid.errors import ResidError
from resid.interventions import Hook


class SplicedCLT:
    """The hooks of one spliced CLT and what they computed during the pass."""

    def __init__(self, clt: CrossLayerTranscoder, error: bool, model):
        self.clt, self.error, self.model = clt, error, model
        self.inputs: list[Tensor] = []
        self.acts: list[Tensor] = []
        self.reconstruction: list[Tensor] = []
        self.errors: list[Tensor] = []

    def hooks(self) -> list[Hook]:
        out = []
        for layer, (p_in, p_out) in enumerate(zip(self.clt.points_in, self.clt.points_out)):
            out += [Hook(p_in.site, self._tap(layer)), Hook(p_out.site, self._splice(layer))]
        return out

    def _tap(self, layer: int):
        def tap(value: Tensor, tokens) -> Tensor:
            x = self.clt.points_in[layer].view(value, self.model)
            self.inputs.append(x)
            self.acts.append(at_real_tokens(self.clt.encode_layer(layer, x), tokens.attention_mask))
            return value

        return tap

    def _splice(self, layer: int):
        def splice(value: Tensor, tokens) -> Tensor:
            point = self.clt.points_out[layer]
            target = point.view(value, self.model)
            recon = self.clt.decode_layer(layer, torch.stack(self.acts), self.inputs[layer])
            error = target - recon
            self.reconstruction.append(recon)
            self.errors.append(error)
            return point.unview(recon + error if self.error else recon, value, self.model)

        return splice

    def record(self, kept) -> CrossLayerEncoded:
        """The record of the pass at the run's kept positions, its activations dense (resid.dictionaries.attach
        stores every dictionary's activations of a batch together)."""
        n = self.clt.n_layers
        if len(self.acts) != n or len(self.reconstruction) != n:
            raise ResidError(f"Cross-layer transcoder {self.clt.name!r} was applied to {len(self.reconstruction)} of "
                             f"{n} layers: a CLT needs the whole pass (not model.resume).")
        return CrossLayerEncoded(self.clt, tuple(kept(a) for a in self.acts),
                                 torch.stack([kept(t) for t in self.reconstruction]),
                                 torch.stack([kept(t) for t in self.errors]),
                                 torch.stack([kept(t) for t in self.inputs]),
                                 "splice" if self.error else "reconstruction")


def observed(clt: CrossLayerTranscoder, run, model) -> CrossLayerEncoded:
    """The CLT applied to an unchanged run's records (observe mode), its activations dense (as SplicedCLT.record)."""
    x = torch.stack([read(run, model, point) for point in clt.points_in])
    target = torch.stack([read(run, model, point) for point in clt.points_out])
    acts = at_real_tokens(clt.encode(x), real_tokens(run))
    recon = clt.decode(acts, x if clt.W_skip is not None else None)
    return CrossLayerEncoded(clt, tuple(acts), recon, target - recon, x, "observe")

