"""The precision rule of dictionaries (resid.dictionaries.dictionary.product_dtype): a matrix product runs in half
precision only where the input and the dictionary's weights are both in it on an accelerator, in float32 otherwise;
biases, thresholds and TopK's selection are float32 either way. The accelerator's rule is checked here on the CPU by
applying it there."""

import copy
from pathlib import Path

import pytest
import torch
from random_dictionaries import random_dictionary
from random_models import make_random_model
from safetensors.torch import load_file

import resid.dictionaries
from resid.dictionaries import dictionary as dictionary_module
from resid.dictionaries.dictionary import ActivationFunction, Weights, product_dtype

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"
HALF = dict(rtol=1e-2, atol=1e-2)  # the bf16 tolerance of test_reference's bf16 test
HALVES = (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", HALVES)
def test_products_are_half_precision_only_for_half_inputs_and_weights_off_the_cpu(dtype) -> None:
    half, full = torch.zeros(2, dtype=dtype, device="meta"), torch.zeros(2, device="meta")
    assert product_dtype(half, half) == dtype  # "meta" stands for any device that is not the CPU
    assert product_dtype(half, full) == product_dtype(full, half) == torch.float32
    on_cpu = torch.zeros(2, dtype=dtype)
    assert product_dtype(on_cpu, on_cpu) == torch.float32  # measured faster in float32 there


@pytest.fixture
def accelerator_rule(monkeypatch):
    """product_dtype as on an accelerator, applied on the CPU."""
    monkeypatch.setattr(dictionary_module, "product_dtype", lambda x, w: x.dtype if x.dtype == w.dtype
                        and x.dtype in HALVES else torch.float32)


def test_a_float32_dictionary_computes_in_float32_under_a_bfloat16_input(accelerator_rule) -> None:
    sae = resid.dictionaries.load(DATA / "saelens" / "standard")
    x = load_file(str(DATA / "saelens" / "standard.reference.safetensors"))["x"].bfloat16()
    acts, out = sae(x)
    assert torch.equal(acts, sae.encode(x.float()).bfloat16())
    assert torch.equal(out, sae.decode(acts.float()).bfloat16())


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk", "gated"])
def test_a_bfloat16_dictionary_keeps_the_bfloat16_tolerance(accelerator_rule, activation: str) -> None:
    """Against the same bf16 weights computed in float32: equal to the bf16 tolerance, and which features fire is
    decided exactly as in float32 for the discontinuous activations (their encoder products stay float32)."""
    model = make_random_model("llama_gqa")
    d = random_dictionary(model, "blocks.0.hook_resid_post", d_sae=40, activation="relu", seed=3, skip=False)
    if activation != "relu":
        g = torch.Generator().manual_seed(4)
        if activation != "gated":
            function = ActivationFunction(activation, 0.2 * torch.rand(40, generator=g),
                                          5 if activation == "topk" else None)
        else:
            function = ActivationFunction("gated", b_gate=-0.3 * torch.rand(40, generator=g),
                                          b_mag=0.1 * torch.randn(40, generator=g),
                                          r_mag=0.1 * torch.randn(40, generator=g))
        b_enc = None if activation == "gated" else d.b_enc.data
        d = resid.dictionaries.Dictionary(Weights(d.W_enc.data, d.W_dec.data, d.b_dec.data, b_enc), function)
    half, full = copy.deepcopy(d).to(torch.bfloat16), copy.deepcopy(d).to(torch.bfloat16).float()
    x = torch.randn(20, 8, model.config.d_model, generator=torch.Generator().manual_seed(0)).bfloat16()
    (acts, out), (acts_full, out_full) = half(x), full(x.float())
    assert acts.dtype == out.dtype == torch.bfloat16
    # relu: the products ran in bf16 (so they differ); the others decide in float32 (so they do not)
    assert torch.equal(acts, acts_full.bfloat16()) == (activation != "relu")
    torch.testing.assert_close(acts.float(), acts_full, **HALF)
    torch.testing.assert_close(out.float(), out_full, **HALF)
