"""dtype and device are honoured; half precision stays close to float32 on the real model."""

import pytest
import torch

import resid

PROMPT = "The Eiffel Tower is located in the city of"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_smollm2(smollm2, dtype):
    half = resid.load("smollm2-135m", dtype=dtype)
    assert half.dtype == dtype and all(p.dtype == dtype for p in half.parameters())
    logits = half.run(PROMPT).logits[0, -1].float()
    reference = smollm2.run(PROMPT).logits[0, -1]
    assert logits.argmax() == reference.argmax()
    probs, ref_probs = logits.softmax(-1), reference.softmax(-1)
    assert (probs - ref_probs).abs().max() < 0.05


def test_dtype_names_are_accepted():
    assert resid.load("smollm2-135m", dtype="bf16").dtype == torch.bfloat16


def test_cuda_matches_cpu(smollm2, gpu):
    on_gpu = resid.load("smollm2-135m", device=gpu)
    assert on_gpu.device.type == gpu.type
    torch.testing.assert_close(on_gpu.run(PROMPT).logits.cpu(), smollm2.run(PROMPT).logits, atol=1e-3, rtol=1e-3)


def test_bfloat16_on_the_gpu_predicts_as_float32_on_the_cpu(smollm2, gpu):
    half = resid.load("smollm2-135m", device=gpu, dtype=torch.bfloat16)
    logits = half.run(PROMPT).logits[0, -1].float().cpu()
    reference = smollm2.run(PROMPT).logits[0, -1]
    assert logits.argmax() == reference.argmax()
    assert (logits.softmax(-1) - reference.softmax(-1)).abs().max() < 0.05


def test_rotary_frequencies_stay_float32_in_a_bfloat16_model():
    from random_models import make_random_model

    model = make_random_model("llama_gqa", n_ctx=2048)
    reference = model.rotary.inv_freq.clone()
    positions = torch.arange(2048)[None]
    cos32, _ = model.rotary.cos_sin(positions, torch.float32)
    model.to(torch.bfloat16)
    assert model.rotary.inv_freq.dtype == torch.float32 and torch.equal(model.rotary.inv_freq, reference)
    cos16, _ = model.rotary.cos_sin(positions, torch.bfloat16)
    # only the final rounding to bfloat16 (with bfloat16 frequencies the angles drift by ~0.1 rad at 1,000)
    assert (cos16.float() - cos32).abs().max() < 0.01


def test_a_mixture_of_experts_records_its_experts_under_bfloat16_autocast():
    from moe_models import make_moe_model

    model = make_moe_model()
    ids = torch.randint(0, model.config.d_vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    capture = resid.Capture(mlp={"post", "expert_out"})
    exact = model.run(ids, capture=capture).stream.layers[1].mlp
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = model.run(ids, capture=capture).stream.layers[1].mlp
    for field in ("post", "expert_out"):
        got, want = getattr(auto, field), getattr(exact, field)
        assert got.dtype == torch.float32
        assert (got - want).abs().max() <= 0.03 * want.abs().max(), field  # bf16's 3 digits
