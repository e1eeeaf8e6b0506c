"""The exactness invariants of docs/design.md on every supported variant (tiny random models loaded from their
saved folders): the writes sum to the final residual, the derived residuals are consistent, interventions
match the same edit made with a Hugging Face hook, and nothing stays attached to the model."""

from collections.abc import Callable

import pytest
import torch
from tiny_fixtures import Tiny, random_ids
from tiny_models import hf_attn, hf_final_norm, hf_mlp

import resid


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _hf_logits(tiny: Tiny, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return tiny.hf(ids).logits


def _hf_final_residual(tiny: Tiny, ids: torch.Tensor) -> torch.Tensor:
    """Hugging Face's residual stream entering the final norm, read by a hook on that norm's input."""
    seen = []
    handle = hf_final_norm(tiny.hf).register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        _hf_logits(tiny, ids)
    finally:
        handle.remove()
    return seen[0]


def test_components_sum_to_the_final_residual(tiny: Tiny):
    ids = random_ids()
    stream = tiny.model.run(ids, capture=resid.Capture.all()).stream
    sites, writes = stream.components()
    assert len(sites) == writes.shape[0] == 2 * tiny.model.config.n_layers + (2 if stream.pos_embed is not None else 1)
    total = writes.sum(0)
    assert _rel_err(total, stream.final()) < 1e-5
    assert _rel_err(total, _hf_final_residual(tiny, ids)) < 1e-5


def test_resid_pre_mid_post_are_consistent(tiny: Tiny):
    stream = tiny.model.run(random_ids(), capture=resid.Capture.all()).stream
    parallel = tiny.model.config.block == "parallel"
    n_layers = tiny.model.config.n_layers
    for layer in range(n_layers):
        if layer + 1 < n_layers:
            assert torch.equal(stream.resid_pre(layer + 1), stream.resid_post(layer))
        mid = stream.resid_mid(layer)
        assert (mid is None) == parallel
        # What the MLP norm reads is resid_mid (resid_pre for parallel blocks).
        mlp_reads = stream.resid_pre(layer) if parallel else mid
        if tiny.model.blocks[layer].ln_mlp is None:  # OLMo 2: the MLP reads resid_mid itself, and says so
            with pytest.raises(resid.ResidError, match="without a norm"):
                stream.layers[layer].mlp.normalized
            continue
        normalized, _ = tiny.model.blocks[layer].ln_mlp(mlp_reads)
        torch.testing.assert_close(normalized, stream.layers[layer].mlp.normalized, atol=1e-5, rtol=0)
    assert torch.equal(stream.resid_pre(n_layers), stream.final())


def test_empty_interventions_change_nothing(tiny: Tiny):
    ids = random_ids()
    plain = tiny.model.run(ids).logits
    assert torch.equal(tiny.model.run(ids, interventions=[]).logits, plain)
    assert torch.equal(tiny.model.run(ids, capture=resid.Capture.none()).logits, plain)
    # Capture.all() computes the pattern beside the fused kernel, which still makes z: the same bits.
    assert torch.equal(tiny.model.run(ids, capture=resid.Capture.all()).logits, plain)


def _zero_output(module, args, output):
    if isinstance(output, tuple):  # gpt-oss's MLP returns (output, router scores)
        return (torch.zeros_like(output[0]), *output[1:])
    return torch.zeros_like(output)


def _zero_attn_output(module, args, output):
    # Hugging Face attention modules return (attn_output, attn_weights).
    return (torch.zeros_like(output[0]), *output[1:])


@pytest.mark.parametrize(
    ("part", "hf_module", "hook"),
    [("mlp", hf_mlp, _zero_output), ("attn", hf_attn, _zero_attn_output)],
    ids=["mlp", "attn"],
)
def test_zero_ablation_matches_a_hf_hook(tiny: Tiny, part: str, hf_module: Callable, hook: Callable):
    ids = random_ids()
    before = tiny.model.run(ids).logits
    ablated = tiny.model.run(ids, interventions=[resid.ZeroAblate(resid.Site(1, part))]).logits
    handle = hf_module(tiny.hf, 1).register_forward_hook(hook)
    try:
        expected = _hf_logits(tiny, ids)
    finally:
        handle.remove()
    torch.testing.assert_close(ablated, expected, atol=1e-5, rtol=0)
    assert (ablated - before).abs().max() > 1e-2  # the ablation did something
    # Interventions never stay attached: a plain run afterwards is the plain run from before.
    assert torch.equal(tiny.model.run(ids).logits, before)


def test_final_norm_recomputes_the_logits(tiny: Tiny):
    model = tiny.model
    run = model.run(random_ids(), capture=resid.Capture.all())
    final = run.stream.final()
    assert torch.equal(model.unembed(model.ln_final(final)[0]), run.logits)
    # With the recorded scale frozen, the final norm is affine in final(): the logits follow from it.
    centred = final - final.mean(-1, keepdim=True) if model.config.norm == "layernorm" else final
    normalized = centred * run.stream.final_norm_scale * model.ln_final.gain
    if model.ln_final.b is not None:
        normalized = normalized + model.ln_final.b
    logits = normalized @ model.unembed.W_U
    if model.unembed.b_U is not None:
        logits = logits + model.unembed.b_U
    cap = model.config.final_softcap
    assert (run.uncapped_logits is None) == (cap is None)
    if cap is None:
        torch.testing.assert_close(logits, run.logits, atol=1e-4, rtol=0)
    else:  # the affine part gives the logits before the soft cap; the cap bends them after
        torch.testing.assert_close(logits, run.uncapped_logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(cap * torch.tanh(run.uncapped_logits / cap), run.logits, atol=1e-5, rtol=0)
        assert (run.logits.abs() < cap).all() and (run.uncapped_logits.abs() > cap).any()
