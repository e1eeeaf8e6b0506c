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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu(smollm2):
    gpu = resid.load("smollm2-135m", device="cuda")
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.run(PROMPT).logits.cpu(), smollm2.run(PROMPT).logits, atol=1e-3, rtol=1e-3)
