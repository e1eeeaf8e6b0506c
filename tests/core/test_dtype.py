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
