"""Each hook-point mapping reads what the hook means: the resid Site a hook name maps to holds the tensor that the
Hugging Face module named by the hook (or, for TransformerLens names, the equivalent module) computes, taken with
forward hooks on the tiny random transformers models (tests/tiny_models.py)."""

import pytest
import torch
from tiny_fixtures import build_tiny, random_ids

import resid
from resid.dictionaries import hook_point
from resid.dictionaries.hooks import read, width

# variant -> [(hook name, the Hugging Face module tensor it means: "path.input" / "path.output", or
# "std:path" for the standardized input of a norm module)]
L = "model.layers"
CASES = {
    "llama": [
        ("model.layers.1.output", None), ("model.layers.0.input", None), ("model.layers.1.mlp.output", None),
        ("model.layers.0.mlp.input", None), ("model.layers.1.post_attention_layernorm.output", None),
        ("model.layers.0.input_layernorm.output", None), ("model.layers.1.self_attn.output", None),
        ("model.layers.0.self_attn.o_proj.input", None), ("layers.1.mlp.input", f"{L}.1.mlp.input"),
        ("blocks.1.hook_resid_post", f"{L}.1.output"), ("blocks.1.hook_resid_pre", f"{L}.1.input"),
        ("blocks.0.hook_resid_mid", f"{L}.0.post_attention_layernorm.input"),
        ("blocks.0.hook_mlp_in", f"{L}.0.post_attention_layernorm.input"),
        ("blocks.1.ln2.hook_normalized", f"std:{L}.1.post_attention_layernorm"),
        ("blocks.0.ln1.hook_normalized", f"std:{L}.0.input_layernorm"),
        ("blocks.0.mlp.hook_in", f"{L}.0.mlp.input"), ("blocks.0.mlp.hook_out", f"{L}.0.mlp.output"),
        ("blocks.1.hook_mlp_out", f"{L}.1.mlp.output"), ("blocks.0.hook_attn_out", f"{L}.0.self_attn.output"),
        ("blocks.1.attn.hook_z", f"{L}.1.self_attn.o_proj.input"),
    ],
    "gemma2": [  # sandwich norms: post_attention_layernorm is the attention's post-norm
        ("model.layers.0.pre_feedforward_layernorm.output", None),
        ("model.layers.1.post_feedforward_layernorm.output", None),
        ("model.layers.0.post_attention_layernorm.output", None), ("model.layers.1.output", None),
        ("model.layers.1.self_attn.o_proj.input", None),
        ("blocks.0.hook_mlp_out", f"{L}.0.post_feedforward_layernorm.output"),
        ("blocks.1.hook_mlp_in", f"{L}.1.pre_feedforward_layernorm.input"),
        ("blocks.1.ln2.hook_normalized", f"std:{L}.1.pre_feedforward_layernorm"),
        ("blocks.0.mlp.hook_in", f"{L}.0.mlp.input"), ("model.layers.1.mlp.output", None),
        ("blocks.0.mlp.hook_out", f"{L}.0.mlp.output"), ("model.layers.0.self_attn.output", None),
    ],
    "gpt_neox_parallel": [  # both sublayers read resid_pre; post_attention_layernorm is the MLP's input norm
        ("gpt_neox.layers.1.post_attention_layernorm.output", None), ("gpt_neox.layers.0.mlp.output", None),
        ("gpt_neox.layers.1.attention.dense.input", None), ("gpt_neox.layers.0.output", None),
        ("blocks.1.hook_mlp_in", "gpt_neox.layers.1.input"),
        ("blocks.0.ln2.hook_normalized", "std:gpt_neox.layers.0.post_attention_layernorm"),
    ],
    "gpt2": [
        ("transformer.h.0.ln_2.output", None), ("transformer.h.1.mlp.output", None),
        ("transformer.h.1.attn.c_proj.input", None), ("transformer.h.0.output", None),
        ("transformer.h.1.ln_1.output", None), ("h.0.mlp.output", "transformer.h.0.mlp.output"),
    ],
}


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny_run(request, tmp_path_factory):
    tiny = build_tiny(request.param, tmp_path_factory)
    ids = random_ids(3)[:, :8]
    modules = {path for name, means in CASES[tiny.variant] for path in [_module(means or name)]}
    captured, handles = {}, []
    for path, end in modules:
        module = tiny.hf.get_submodule(path)
        if end == "output":
            hook = (lambda p: lambda m, args, out: captured.__setitem__((p, "output"), out[0] if isinstance(out, tuple)
                                                                         else out))(path)
            handles.append(module.register_forward_hook(hook))
        else:
            hook = (lambda p: lambda m, args, kwargs: captured.__setitem__(
                (p, "input"), args[0] if args else kwargs["hidden_states"]))(path)
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    with torch.no_grad():
        tiny.hf(ids)
    for handle in handles:
        handle.remove()
    run = tiny.model.run(ids, capture=resid.Capture.all())
    return tiny, run, captured


def _module(means: str) -> tuple[str, str]:
    if means.startswith("std:"):
        return means.removeprefix("std:"), "input"
    path, _, end = means.rpartition(".")
    return path, end


def test_each_hook_reads_the_tensor_it_means(tiny_run) -> None:
    tiny, run, captured = tiny_run
    model = tiny.model
    for name, means in CASES[tiny.variant]:
        point = hook_point(name, model.config)
        expected = captured[_module(means or name)]
        if (means or "").startswith("std:"):
            assert point.standardized, name
            expected = _standardized(expected, model.config)
        if point.before_post_norm:  # resid's write is after the post-norm: the HF tensor through it equals it
            post = model.blocks[point.site.layer].ln_mlp_post if point.site.part == "mlp" else \
                model.blocks[point.site.layer].ln_attn_post
            record = getattr(run.stream.layers[point.site.layer], point.site.part)
            found, expected = run.read(point.site), post.linear(expected) * record.post_norm_scale
        else:
            found = read(run, model, point)
        assert found.shape[-1] == width(point, model.config), name
        torch.testing.assert_close(found, expected.to(found.dtype), rtol=1e-4, atol=1e-4, msg=f"{name} -> {point}")


def _standardized(x: torch.Tensor, config: resid.ModelConfig) -> torch.Tensor:
    """A norm's input before its gain and bias, computed from the transformers tensor."""
    x = x.float()
    if config.norm == "layernorm":
        x = x - x.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.norm_eps)


def test_post_norm_flags_follow_the_model(tiny_run) -> None:
    """A sublayer's module output is before the post-norm only where the model has post-norms."""
    tiny, _, _ = tiny_run
    prefix = {"gpt2": "transformer.h", "gpt_neox_parallel": "gpt_neox.layers"}.get(tiny.variant, "model.layers")
    point = hook_point(f"{prefix}.0.mlp.output", tiny.model.config)
    assert point.before_post_norm == tiny.model.config.post_norms
    assert point.site == resid.Site(0, "mlp")
