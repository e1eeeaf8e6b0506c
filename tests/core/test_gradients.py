"""Gradients through model.run(grad=True), which attribution patching relies on, equal transformers' autograd
on the tiny random models of every family: the gradient of a last-token logit difference with respect to the
token embedding matrix (the one weight both store in the same layout)."""

import torch
from tiny_fixtures import random_ids


def test_embedding_gradient_matches_transformers(tiny):
    ids = random_ids(3)
    target, baseline = 11, 42
    tiny.hf.zero_grad()
    logits = tiny.hf(input_ids=ids).logits[:, -1]
    (logits[:, target] - logits[:, baseline]).sum().backward()
    expected = tiny.hf.get_input_embeddings().weight.grad
    tiny.hf.zero_grad()  # the test leaves no gradients on the shared fixtures
    model = tiny.model
    model.zero_grad()
    ours = model.run(ids, grad=True, logits_at="last").logits[:, 0]
    (ours[:, target] - ours[:, baseline]).sum().backward()
    got = model.embed.W_E.grad
    scale = expected.abs().max()
    assert torch.allclose(got, expected, atol=1e-4 * scale + 1e-6), (got - expected).abs().max() / scale
    model.zero_grad()
