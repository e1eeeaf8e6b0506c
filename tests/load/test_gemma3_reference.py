"""resid.load("gemma-3-270m") reproduces transformers' fp32 eager outputs on the same dequantized GGUF weights
(tests/data/gemma3-270m/reference_outputs.json, from make_reference.py there), and predicts sensibly."""

import json
from pathlib import Path

import pytest
import torch

import resid

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "gemma3-270m" / "reference_outputs.json"


@pytest.fixture(scope="module")
def gemma3() -> resid.Transformer:
    # A missing package fails rather than skips: `make test` installs the extra resid-stream[gemma3].
    try:
        return resid.load("gemma-3-270m")
    except resid.ResidError as err:
        pytest.fail(f"resid.load('gemma-3-270m') failed: {err}")


@pytest.fixture(scope="module")
def reference() -> dict:
    assert REFERENCE.exists(), f"{REFERENCE} is missing; regenerate it with tests/data/gemma3-270m/make_reference.py"
    return json.loads(REFERENCE.read_text())


def test_reference_prompts(gemma3: resid.Transformer, reference: dict) -> None:
    assert len(reference["prompts"]) == 4
    for prompt in reference["prompts"]:
        assert gemma3.to_tokens(prompt["text"]).ids[0].tolist() == prompt["input_ids"]  # BOS prepended
        logits = gemma3.run(torch.tensor(prompt["input_ids"])).logits[0]
        assert logits.argmax(-1).tolist() == prompt["argmax_per_position"]
        top = logits[-1].topk(20)
        assert top.indices.tolist() == [i for i, _ in prompt["last_top20"]]
        torch.testing.assert_close(top.values, torch.tensor([v for _, v in prompt["last_top20"]]), atol=1e-3, rtol=0)
        assert abs(logits[-1].logsumexp(-1).item() - prompt["last_logsumexp"]) < 1e-3


@pytest.mark.parametrize(
    ("text", "token", "k"),
    [
        ("The capital of France is", " Paris", 5),
        ("The Eiffel Tower is located in the city of", " Paris", 1),
        ("When Mary and John went to the store, John gave a drink to", " Mary", 1),
    ],
)
def test_factual_predictions(gemma3: resid.Transformer, text: str, token: str, k: int) -> None:
    logits = gemma3.run(text).logits[0, -1]
    assert gemma3.tokenizer.token_id(token, "target") in logits.topk(k).indices.tolist()


def test_capture_all_gives_the_same_logits(gemma3: resid.Transformer) -> None:
    ids = gemma3.to_tokens(["The capital of France is", "Paris is the capital of"]).ids
    plain = gemma3.run(ids).logits
    torch.testing.assert_close(gemma3.run(ids, capture=resid.Capture.all()).logits, plain, atol=0, rtol=0)


def test_config(gemma3: resid.Transformer) -> None:
    cfg = gemma3.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab) == (
        18, 640, 4, 1, 256, 2048, 262144,
    )
    assert cfg.layer_types == (("sliding",) * 5 + ("full",)) * 3 and cfg.sliding_window == 512
    assert (cfg.rotary_base, cfg.rotary_base_local, cfg.attn_scale) == (1e6, 10000.0, 256**-0.5)
    assert cfg.tie_embeddings and cfg.post_norms and cfg.qk_norm == "head" and cfg.norm_gain_offset == 1.0
    assert gemma3.tokenizer.prepend_bos is True and gemma3.tokenizer.bos_token_id == 2
