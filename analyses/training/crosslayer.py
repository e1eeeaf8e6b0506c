"""Training a cross-layer transcoder (CLT; Ameisen et al. 2025) on every layer of a model from one forward pass.

    clt = train_crosslayer(model, corpus.demo(), Recipe(activation="batchtopk", k=16, d_sae=1024),
                           Execution(out="runs/clt"))
    run = model.run(prompt, dictionaries=[clt])                  # a resid.dictionaries.CrossLayerTranscoder

Axes: `token` the rows of a training batch, `layer` the model's layers (a feature's source layer or a target
layer), `feature` the d_sae features of one source layer, `d_in` / `d_out` the widths of an MLP's input and write.

A feature of layer l reads layer l's MLP input (as the per-layer transcoders read it: Spec.transcoder, standardized
before the pre-MLP norm's gain where it can be) and writes into the MLP write of layer l and of every later layer:

    pre[l]  = x[l] @ W_enc[l] + b_enc[l]
    a[l]    = act(pre[l])
    y^[t]   = sum over l <= t of a[l] @ W_dec[l][:, t - l] + b_dec[t]
    loss    = sum over t of sum_d (y[t] - y^[t])^2 (mean over tokens) + the sparsity term

Activations (Recipe.activation):
    batchtopk  per source layer, relu(pre[l]) kept at its k x tokens largest entries over the batch (batchtopk.py);
               each feature's decoder (its rows into every target it writes, concatenated) kept at unit norm, so
               that the selection compares features on equal terms; no sparsity term (k is the sparsity). A
               threshold per layer tracks the smallest kept activation as the per-layer BatchTopK does, and the
               CLT is exported as a JumpReLU with that threshold for the layer's features. The decoders read only
               the kept entries' rows (decode_sparse): k rows per token and source layer, where a dense decode
               multiplies every feature's rows into every target.
    jumprelu   a = pre * (pre > threshold) with jumprelu.JumpReLU's straight-through threshold gradient; the
               sparsity term is Ameisen et al.'s: l0_coefficient x sum over l, i of tanh(tanh_scale x |W_dec[l]_i|
               x a[l]_i) (mean over tokens), |W_dec[l]_i| the norm of feature i's decoder over all its targets.
               Decoded densely: the threshold's gradient needs the decoders' pull on features below it too.
TopK (exported as no threshold can say) and ReLU are refused. Not here: AuxK for dead BatchTopK features (a
feature counts as dead after recipe.dead_tokens tokens without firing, 10M by default) and Anthropic's pre-activation
loss.

The decoders grow with the layers squared: n (n + 1) / 2 blocks of [d_sae d_out]. `check_memory` states their
bytes with the gradients, Adam's moments and a batch's activations, and refuses before any work what the device
cannot hold, saying how many features per layer fit. Normalisation (Recipe.normalize "expected_average_only_in") is
per layer: x[l] and y[l] times constants of the first batch, folded into the exported weights.

Training reuses the per-layer machinery whole: the Coder interface (one CrossLayerCoder is one Trainer's coder, so
Adam, the schedule, the non-finite guard and the checkpointed state are the Trainer's), the Activations stream and
the step job of resid.analyses.training.loop (CrossLayerJob: its checkpoint, resumption and progress). The batch
is stacked as [token layer d]: Trainer's FVU is then pooled over every target layer and its L0 is per layer.
"""

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from resid.analyses.distributed.execution import Execution, as_execution
from resid.analyses.distributed.steps import drive_steps, older_arguments
from resid.analyses.io import corpus as corpora
from resid.analyses.training.activations import Activations, Position
from resid.analyses.training.batchtopk import batch_top_k, starts, tracked
from resid.analyses.training.coder import Coder, geometric_median
from resid.analyses.training.jumprelu import JumpReLU
from resid.analyses.training.loop import FORWARD_BATCH, Spec, TrainingJob, buffer_size, source_fingerprint
from resid.analyses.training.recipe import Recipe
from resid.analyses.training.trainer import Stats, Trainer
from resid.batching import available_bytes
from resid.dictionaries import CrossLayerTranscoder, check
from resid.dictionaries.formats import circuit_tracer
from resid.dictionaries.hooks import HookPoint, width
from resid.errors import ResidError, param
from resid.model import Transformer

ACTIVATIONS = ("batchtopk", "jumprelu")
TANH_SCALE = 1.0  # c of Ameisen et al.'s tanh(c |W_dec| a) (a hyperparameter there; 1 keeps tanh near |W_dec| a)


def check_memory(n_layers: int, d_in: int, d_out: int, recipe: Recipe, device: torch.device) -> int:
    """d_sae per layer, after checking that the CLT with its gradients, Adam's two moments and a batch's activations
    fits in 80% of the free memory of `device` (refused before anything is allocated, saying how many features
    per layer fit). Returns the bytes needed."""
    d_sae = recipe.check_width(d_in, "of each layer of the cross-layer transcoder")
    blocks = n_layers * (n_layers + 1) // 2  # decoder blocks: each source layer to itself and every later layer
    # per feature of one layer, for all layers: the encoder column, bias and threshold, and its decoder rows into
    # every target; 4 copies (weights, gradients, 2 moments) of 4 bytes; and in a batch its pre-activation,
    # activation and their gradients (16 bytes a token)
    per_feature = 16 * (n_layers * (d_in + 2) + blocks * d_out) + 16 * recipe.batch_size * n_layers
    # independent of d_sae: each source layer's decoded writes into its targets and their gradients, and the targets
    fixed = 4 * recipe.batch_size * (2 * blocks * d_out + 2 * n_layers * (d_in + d_out))
    need = per_feature * d_sae + fixed
    free = available_bytes(device)
    if free is not None and need > 0.8 * free:
        fit = max(0, int((0.8 * free - fixed) / per_feature))
        given = param("d_sae", recipe.d_sae) if recipe.d_sae is not None else param("expansion", recipe.expansion)
        what = f"at most {fit:,} features per layer fit" if fit else "not even one feature per layer fits"
        raise ResidError(
            f"A cross-layer transcoder of {n_layers} layers x {d_sae:,} features ({given}) needs {_size(need)} "
            f"for its weights ({blocks} decoder blocks of {d_sae:,} x {d_out}: they grow with the layers squared), "
            f"their gradients, Adam's moments and a batch's activations, more than the {_size(0.8 * free)} usable "
            f"of the {_size(free)} free on {device}: {what} here with {param('batch_size', recipe.batch_size)}; "
            "lower the width or the batch, or train on a larger device.")
    return need


def _size(n: int | float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


class CrossLayerCoder(Coder):
    """The CLT being trained (see the module docstring): one Coder over every layer, its batch [token layer d]."""

    def __init__(self, n_layers: int, d_in: int, d_out: int, recipe: Recipe, tanh_scale: float = TANH_SCALE):
        # Coder's own weights are one layer's; this coder has a set per layer, so it builds its own
        nn.Module.__init__(self)
        if recipe.activation not in ACTIVATIONS:
            raise ResidError(
                f"A cross-layer transcoder trains with activation 'batchtopk' or 'jumprelu' (both saved as JumpReLU, "
                f"which circuit-tracer's CLT format holds), not {param('activation', recipe.activation)}: "
                "use batchtopk for a k per token without a coefficient.")
        if recipe.normalize == "constant_norm_rescale":
            raise ResidError("normalize='constant_norm_rescale' is for SAEs: a cross-layer transcoder's targets are "
                             "other tensors, which its inputs' norms cannot rescale; 'expected_average_only_in' "
                             "scales each layer's input and target by their own constants.")
        self.recipe, self.transcoder, self.tanh_scale = recipe, True, tanh_scale
        self.n_layers, self.d_in, self.d_out, self.d_sae = n_layers, d_in, d_out, recipe.width(d_in)
        self.unit_norm = recipe.activation == "batchtopk"
        self.activation = "jumprelu"  # as exported: BatchTopK's tracked threshold, or JumpReLU's own
        n, f = n_layers, self.d_sae
        g = torch.Generator().manual_seed(recipe.seed)
        norm = recipe.decoder_init_norm if recipe.decoder_init_norm is not None else (1.0 if self.unit_norm else 0.1)
        W_dec = []
        for source in range(n):  # each feature's decoder over all its targets at norm `norm`
            w = torch.randn(f, n - source, d_out, generator=g)
            W_dec.append(nn.Parameter(norm * w / w.flatten(1).norm(dim=1)[:, None, None]))
        W_enc = torch.randn(n, d_in, f, generator=g)
        self.W_enc = nn.Parameter(norm * W_enc / W_enc.norm(dim=1, keepdim=True))
        self.b_enc = nn.Parameter(torch.zeros(n, f))
        self.W_dec = nn.ParameterList(W_dec)
        self.b_dec = nn.Parameter(torch.zeros(n, d_out))
        self.W_skip = None
        self.apply_b_dec_to_input = False
        if recipe.activation == "jumprelu":
            self.threshold = nn.Parameter(torch.full((n, f), float(recipe.init_threshold)))
        else:
            self.register_buffer("threshold", torch.full((n,), -1.0))  # negative: not tracked yet
        self.register_buffer("since_fired", torch.zeros(n, f, dtype=torch.long))
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool))
        self.register_buffer("in_scale", torch.ones(n))
        self.register_buffer("out_scale", torch.ones(n))

    # --- the maths -------------------------------------------------------------------------------------------
    def pre(self, x: Float[Tensor, "token layer d_in"]) -> Float[Tensor, "token layer feature"]:
        return torch.einsum("tld,ldf->tlf", x, self.W_enc) + self.b_enc

    def decode(self, acts: Float[Tensor, "token layer feature"], x: Tensor | None = None
               ) -> Float[Tensor, "token layer d_out"]:
        """Every target's reconstruction: each source layer's features decoded into all its targets in one product,
        added into targets source.. of the output."""
        tokens = acts.shape[0]
        return Writes.apply(self.b_dec, *((acts[:, source] @ w.flatten(1)).view(tokens, -1, self.d_out)
                                          for source, w in enumerate(self.W_dec)))

    def decode_sparse(self, kept: list[tuple[Tensor, Tensor, Tensor]], tokens: int
                      ) -> Float[Tensor, "token layer d_out"]:
        """`decode` from each source layer's kept entries (values, token, feature; sorted by token, as
        batch_top_k gives them): a gather of the active features' decoder rows over all their targets (torch's
        embedding_bag, as Coder.decode_sparse for one layer), so a step costs k rows per token and source layer
        instead of a dense [token feature] @ [feature target x d_out] product and its gradient."""
        return Writes.apply(self.b_dec, *(
            F.embedding_bag(feature, w.view(self.d_sae, -1), starts(token, tokens), mode="sum",
                            per_sample_weights=values).view(tokens, -1, self.d_out)
            for w, (values, token, feature) in zip(self.W_dec, kept, strict=True)))

    def decoder_norms(self) -> Float[Tensor, "layer feature"]:
        """Each feature's decoder norm over all the targets it writes."""
        return torch.stack([w.flatten(1).norm(dim=1) for w in self.W_dec])

    def loss(self, x: Tensor, y: Tensor, step: int, dead: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        pre = self.pre(x)
        if self.recipe.activation == "batchtopk":
            # unbound once: a per-layer slice pre[:, layer] would give back a gradient of all of pre for each layer
            kept = [self._batch_top_k(one, layer, step) for layer, one in enumerate(pre.unbind(1))]
            y_hat = self.decode_sparse(kept, len(x))
            with torch.no_grad():  # for the Trainer's statistics and dead-feature counts
                acts = torch.zeros_like(pre)
                for layer, (values, token, feature) in enumerate(kept):
                    acts[:, layer].index_put_((token, feature), values)
            return (y - y_hat).pow(2).sum((-1, -2)).mean(), acts, y_hat
        acts = JumpReLU.apply(pre, self.threshold, self.recipe.bandwidth)
        penalty = torch.tanh(self.tanh_scale * self.decoder_norms() * acts).sum((-1, -2)).mean()
        y_hat = self.decode(acts)
        sparsity = self.recipe.l0_coefficient * self.recipe.sparsity_factor(step) * penalty
        return (y - y_hat).pow(2).sum((-1, -2)).mean() + sparsity, acts, y_hat

    def _batch_top_k(self, pre: Tensor, layer: int, step: int) -> tuple[Tensor, Tensor, Tensor]:
        """One source layer's BatchTopK entries (values, token, feature; batch_top_k's), its threshold tracked
        after recipe.threshold_start_step steps."""
        values, token, feature = batch_top_k(pre, self.recipe.k)
        if step > self.recipe.threshold_start_step:
            self.threshold[layer] = tracked(self.threshold[layer], values.detach(), self.recipe.threshold_beta)
        return values, token, feature

    # --- around the optimizer step ---------------------------------------------------------------------------
    def normalise(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        if self.recipe.normalize == "expected_average_only_in":
            return x * self.in_scale[:, None], y * self.out_scale[:, None]
        return x, y

    @torch.no_grad()
    def start(self, x: Float[Tensor, "token layer d_in"], y: Float[Tensor, "token layer d_out"]) -> None:
        """From the first batch (once): each layer's normalisation constants, then b_dec from its scaled targets."""
        if bool(self.initialised):
            return
        if self.recipe.normalize == "expected_average_only_in":
            self.in_scale.copy_(self.d_in**0.5 / x.norm(dim=-1).mean(0).clamp_min(1e-12))
            self.out_scale.copy_(self.d_out**0.5 / y.norm(dim=-1).mean(0).clamp_min(1e-12))
        y = self.normalise(x, y)[1]
        if self.recipe.b_dec_init == "mean":
            self.b_dec.copy_(y.mean(0))
        elif self.recipe.b_dec_init == "geometric_median":
            self.b_dec.copy_(torch.stack([geometric_median(y[:, layer]) for layer in range(self.n_layers)]))
        self.initialised.fill_(True)

    @torch.no_grad()
    def before_step(self) -> None:
        """Remove the part of each decoder's gradient that would change its features' norms (unit-norm recipes)."""
        if not self.unit_norm:
            return
        for w in self.W_dec:
            if w.grad is not None:  # g - (g . w) / |w|^2 w per feature, in place: no weight-sized temporaries
                flat, grad = w.flatten(1), w.grad.flatten(1)
                along = torch.einsum("fi,fi->f", grad, flat) / flat.norm(dim=1).square()
                grad.addcmul_(flat, along[:, None], value=-1)

    @torch.no_grad()
    def after_step(self) -> None:
        """Unit-norm decoders (batchtopk); JumpReLU's threshold projected onto threshold >= 0 (a negative one would
        pass negative pre-activations), after the step rather than before the next loss as jumprelu.py does, so
        that a step refused as non-finite changes nothing and the exported threshold is projected too."""
        if self.recipe.activation == "jumprelu":
            self.threshold.clamp_(min=0.0)
        if self.unit_norm:
            for w in self.W_dec:
                w /= w.flatten(1).norm(dim=1)[:, None, None]

    # --- export ----------------------------------------------------------------------------------------------
    def dictionary(self, hook_in: str | None = None, hook_out: str | None = None, name: str = "clt",
                   model_name: str | None = None, metadata: dict | None = None) -> CrossLayerTranscoder:
        """The trained CLT (float32, on the CPU), hooks named within a block (e.g. "ln2.hook_normalized" ->
        "hook_mlp_out"). Normalisation constants are folded in: W_enc[l] x in_scale[l], and W_dec[l][:, t - l],
        b_dec[t] / out_scale[t] (the pre-activations, so thresholds and the selection, are unchanged)."""
        take = lambda t: t.detach().float().cpu().clone()  # noqa: E731
        s_in, s_out = take(self.in_scale), take(self.out_scale)
        metadata = dict(metadata or {})
        if self.recipe.normalize == "expected_average_only_in":
            metadata["folded_scaling_factors"] = {"in": s_in.tolist(), "out": s_out.tolist()}
        if self.recipe.activation == "jumprelu":
            threshold = take(self.threshold)
        else:  # never tracked: the threshold 0 (relu)
            threshold = take(self.threshold).clamp_min(0)[:, None].expand(-1, self.d_sae).contiguous()
        return CrossLayerTranscoder(
            W_enc=take(self.W_enc) * s_in[:, None, None], b_enc=take(self.b_enc),
            W_dec=[take(w) / s_out[source:, None] for source, w in enumerate(self.W_dec)],
            b_dec=take(self.b_dec) / s_out[:, None], activation="jumprelu", threshold=threshold, name=name,
            format="resid-trained", hook_in=hook_in, hook_out=hook_out, model_name=model_name, metadata=metadata)


def train_crosslayer(
    model: Transformer,
    corpus: corpora.Source,
    recipe: Recipe = Recipe(activation="batchtopk"),
    execution: Execution | None = None,
    checkpoint_every: int | None = None,
    window: int = 256,
    buffer_tokens: int | str = "auto",
    keep_bos: bool = False,
    device: torch.device | str | None = None,
    autocast: bool = False,
    max_norm_ratio: float | None = 10.0,
    tanh_scale: float = TANH_SCALE,
    on_step: Callable[[int, list[Stats]], None] | None = None,
) -> CrossLayerTranscoder:
    """A CLT over every layer of `model`, trained on `corpus` as `recipe` says (see the module docstring). The
    arguments are train()'s (resid.analyses.training.loop: checkpoint_every and device belong in the Execution);
    with `execution.out` the run checkpoints and resumes there, and the CLT is written to OUT/clt/ in
    circuit-tracer's CLT format. tanh_scale: c of the JumpReLU sparsity term."""
    execution = older_arguments(as_execution(execution), "train_crosslayer", checkpoint_every=checkpoint_every,
                                device=device)
    device = execution.device
    specs = [Spec.transcoder(model, layer) for layer in range(model.config.n_layers)]
    if buffer_tokens == "auto":
        buffer_tokens = buffer_size(model, specs, recipe.batch_size, execution.out, device)
    job = CrossLayerJob(model, corpora.load(corpus), specs, recipe, window,
                        FORWARD_BATCH if execution.batch_size == "auto" else execution.batch_size, buffer_tokens,
                        keep_bos, device, autocast, max_norm_ratio, tanh_scale, on_step)
    return drive_steps(model, job, execution)


class CrossLayerJob(TrainingJob):
    """TrainingJob's stream, checkpoints and resumption with one trainer, the CLT, whose batch stacks every layer's
    MLP input and write."""

    name = "train-clt"
    kind = "resid.training.crosslayer-checkpoint"

    def __init__(self, model: Transformer, texts: list[str], specs: list[Spec], recipe: Recipe, window: int,
                 forward_batch: int, buffer_tokens: int, keep_bos: bool, device: torch.device | str | None,
                 autocast: bool, max_norm_ratio: float | None, tanh_scale: float, on_step: Callable | None):
        # not TrainingJob.__init__: that one builds a trainer per Spec; the rest of TrainingJob is shared
        self.model, self.specs, self.recipe, self.on_step = model, specs, recipe, on_step
        self.pairs = [s.points(model) for s in specs]
        self.hook_in, self.hook_out = (_in_block([pair[side] for pair in self.pairs]) for side in (0, 1))
        target = torch.device(device) if device is not None else model.device
        d_in, d_out = (width(self.pairs[0][side], model.config) for side in (0, 1))
        check_memory(len(specs), d_in, d_out, recipe, target)
        coder = CrossLayerCoder(len(specs), d_in, d_out, recipe, tanh_scale)  # refuses a wrong recipe before work
        points = [p for pair in self.pairs for p in pair]
        self.source = Activations(model, texts, points, recipe.batch_size, window, forward_batch, buffer_tokens,
                                  keep_bos, recipe.seed, device, autocast, max_norm_ratio)
        self.trainers = [Trainer(coder, self.source.device)]
        self.trainers[0].label = f"the cross-layer transcoder ({self.hook_in} -> {self.hook_out} at every layer)"
        self.names = ["clt"]
        self._settings = {"model": model.name, "crosslayer": {"hook_in": self.hook_in, "hook_out": self.hook_out,
                                                              "tanh_scale": tanh_scale},
                          "recipe": asdict(recipe), "data": source_fingerprint(self.source), "window": window,
                          "forward_batch": forward_batch, "buffer_tokens": buffer_tokens, "keep_bos": keep_bos,
                          "autocast": autocast, "max_norm_ratio": max_norm_ratio}
        self.steps, self.step, self.step_size = recipe.steps, 0, recipe.batch_size
        self.position = Position(0, 0)
        self.stats: list[Stats] = []
        self.postfix: dict[str, str] = {}

    def older_settings(self) -> list[dict]:
        return []

    def train_on(self, batch: dict[HookPoint, Tensor]) -> list[Stats]:
        """The CLT's step on every layer's rows, stacked [token layer d] (TrainingJob.consume drives it)."""
        x = torch.stack([batch[p_in] for p_in, _ in self.pairs], 1)
        y = torch.stack([batch[p_out] for _, p_out in self.pairs], 1)
        return [self.trainers[0].step(x, y)]

    def finish(self, out: Path | None) -> CrossLayerTranscoder:
        trainer = self.trainers[0]
        trainer.check_finite()  # never a NaN CLT, with or without checkpoints
        clt = check(trainer.coder.dictionary(self.hook_in, self.hook_out, name="clt", model_name=self.model.name,
                                             metadata=self.run_info("resid.analyses.training.crosslayer")), self.model)
        if out is not None:
            circuit_tracer.write(clt, Path(out) / "clt")
        return clt.to(self.model.device)


class Writes(torch.autograd.Function):
    """Every target's reconstruction from each source layer's writes, [token target - source d_out] for source
    0..n-1: out[:, t] = b_dec[t] + the sum over sources s <= t of writes[s][:, t - s], added in source order. The
    backward gives each source its slice of the gradient (a view): adding in place into slices of one output would
    make autograd copy the whole gradient once per source layer."""

    @staticmethod
    def forward(ctx: Any, b_dec: Tensor, *writes: Tensor) -> Tensor:
        ctx.sources = len(writes)
        out = b_dec.expand(writes[0].shape[0], -1, -1).clone()
        for source, written in enumerate(writes):
            out[:, source:] += written
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, ...]:
        return (grad.sum(0), *(grad[:, source:] for source in range(ctx.sources)))


def _in_block(points: list[HookPoint]) -> str:
    """The one name, within a block, of every layer's point ("blocks.3.ln2.hook_normalized": "ln2.hook_normalized"),
    which a CLT records once for all layers."""
    names = {p.name.split(".", 2)[2] for p in points}
    if len(names) != 1:  # Spec.transcoder reads every layer alike; a mixed model would need per-layer hooks
        raise ResidError(f"A cross-layer transcoder reads every layer at the same hook, but this model's MLP inputs "
                         f"are read at {sorted(names)}; train per-layer transcoders on it instead.")
    return names.pop()
