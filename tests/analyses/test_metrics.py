"""metric_values against hand computations: each metric on logits whose softmax is known in closed form."""

import math

import pytest
import torch

from resid.analyses.metrics import METRICS, metric_values

# Row 0: logits 1, 2, 3. Row 1: logits 0, ln 3, 0, whose softmax is exactly 1/5, 3/5, 1/5.
LOGITS = torch.tensor([[1.0, 2.0, 3.0], [0.0, math.log(3.0), 0.0]])
TARGETS = torch.tensor([2, 1])
BASELINES = torch.tensor([0, 2])
P_ROW0 = math.exp(3) / (math.exp(1) + math.exp(2) + math.exp(3))

EXPECTED = {
    "logit_diff": [3.0 - 1.0, math.log(3.0) - 0.0],
    "logit": [3.0, math.log(3.0)],
    "target_prob": [P_ROW0, 3 / 5],
    "loss": [-math.log(P_ROW0), -math.log(3 / 5)],
}


@pytest.mark.parametrize("metric", sorted(EXPECTED))
def test_each_metric_matches_the_hand_computation(metric):
    values = metric_values(metric, LOGITS, TARGETS, BASELINES)
    assert values.shape == (2,) and values.dtype == torch.float32
    torch.testing.assert_close(values, torch.tensor(EXPECTED[metric]), atol=1e-6, rtol=1e-6)


def test_every_listed_metric_is_tested():
    assert set(METRICS) == set(EXPECTED)


def test_baselines_are_only_needed_for_logit_diff():
    for metric in ("logit", "target_prob", "loss"):
        torch.testing.assert_close(metric_values(metric, LOGITS, TARGETS), metric_values(metric, LOGITS, TARGETS,
                                                                                        BASELINES))


def test_low_precision_logits_are_scored_in_float32():
    # bfloat16 holds 256 and 258 exactly, but a softmax rounded to bf16 (3 significant digits) would be off.
    logits = torch.tensor([[256.0, 258.0, -5.0]], dtype=torch.bfloat16)
    target, baseline = torch.tensor([1]), torch.tensor([0])
    diff = metric_values("logit_diff", logits, target, baseline)
    assert diff.dtype == torch.float32 and diff.item() == 2.0
    p = 1 / (1 + math.exp(-2) + math.exp(-263))
    torch.testing.assert_close(metric_values("target_prob", logits, target), torch.tensor([p]), atol=1e-6, rtol=0)
    torch.testing.assert_close(metric_values("loss", logits, target), torch.tensor([-math.log(p)]), atol=1e-6, rtol=0)


def test_probabilities_over_the_vocabulary_sum_to_one_and_loss_is_their_negative_log():
    logits = torch.randn(4, 11, generator=torch.Generator().manual_seed(0)) * 5
    rows = torch.arange(4)
    probs = torch.stack([metric_values("target_prob", logits, torch.full((4,), v)) for v in range(11)], dim=1)
    torch.testing.assert_close(probs.sum(1), torch.ones(4))
    targets = torch.tensor([0, 3, 7, 10])
    torch.testing.assert_close(metric_values("loss", logits, targets), -probs[rows, targets].log(), atol=1e-5, rtol=0)
