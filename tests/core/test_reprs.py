"""Reprs print shapes, not values: a full capture's Run and stream print in a line or two (the dataclass reprs
printed every tensor, 15,000 characters for a tiny model), and say what was kept."""

import torch
from random_models import make_random_model

import resid


def test_a_run_and_its_stream_print_their_shapes_in_a_few_lines() -> None:
    model = make_random_model("llama_gqa")
    run = model.run(torch.tensor([[1, 2, 3], [4, 5, 6]]), capture=resid.Capture.all())
    text = repr(run)
    assert len(text) < 600 and "tensor(" not in text, text
    assert "logits [2, 3, 97]" in text and "tokens [2, 3]" in text and "3 layers recorded" in text
    assert "'pattern'" in text and "every position" in text
    last = repr(model.run(torch.tensor([[1, 2, 3]]), capture=resid.Capture(positions=[-1])).stream)
    assert "positions [1, 1]" in last and "fields ['out']" in last
