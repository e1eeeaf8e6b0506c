"""T5 against transformers' T5ForConditionalGeneration (fp32, eager), v1.0 and v1.1 and both ways v1.1 is
saved: every layer of both streams and the logits, padded batches equal single pairs, the relative position
buckets and biases equal transformers' up to 300 positions, the exact decomposition of the decoder's logits,
and the config allow-list (the published t5-small and flan-t5-small configs load; variants are refused)."""

import json
from pathlib import Path

import pytest
import torch
import transformers
from t5_models import PAD, VOCAB, references, t5

import resid
from resid.analyses import attribution
from resid.components.relative import relative_buckets

ATOL, RTOL = 1e-4, 3e-5  # the residual reaches ~30 in these random models: float32 rounding scales with it
VERSIONS = ["1.0", "1.1", "1.1-saved", "umt5"]


@pytest.fixture(scope="module", params=VERSIONS)
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"t5-{request.param}")
    return request.param, t5(folder, request.param), resid.load(folder)


def _ids(seed: int, shape: tuple[int, int]) -> torch.Tensor:
    return torch.randint(2, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def _padded(ids: torch.Tensor, lengths: list[int], side: str) -> resid.Tokens:
    return resid.Tokens.pad([row[:n].tolist() for row, n in zip(ids, lengths)], PAD, side)


def test_every_layer_and_the_logits_match_transformers(pair):
    version, hf, model = pair
    assert isinstance(model, resid.EncoderDecoder)
    assert (model.encoder.config.n_layers, model.decoder.config.n_layers) == (2, 3)
    assert model.decoder.config.tie_embeddings == (version not in ("1.1", "umt5"))
    assert model.decoder.config.relative_bias_per_layer == (version == "umt5")
    source = _padded(_ids(1, (3, 40)), [40, 25, 9], "right")  # past max_distance (24): every kind of bucket
    target = _ids(2, (3, 30))
    target[:, 0] = PAD  # decoder_start_token_id
    out = references(hf, source.ids, target, source.attention_mask.long())
    run = model.run(source, target, capture=resid.Capture(), encoder_capture=resid.Capture())
    torch.testing.assert_close(run.logits, out.logits, atol=ATOL, rtol=RTOL)
    real = source.attention_mask
    for layer, hidden in enumerate(out.encoder_hidden_states[:-1]):  # the last is after the final norm
        torch.testing.assert_close(run.encoder.stream.resid_pre(layer)[real], hidden[real], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(run.encoder.hidden[real], out.encoder_last_hidden_state[real], atol=ATOL, rtol=RTOL)
    for layer, hidden in enumerate(out.decoder_hidden_states[:-1]):
        torch.testing.assert_close(run.stream.resid_pre(layer), hidden, atol=ATOL, rtol=RTOL)
    # v1.0's d_model^-0.5 is folded into the final norm: resid's final hidden state is what the head reads
    multiplier = model.decoder.config.final_norm_multiplier
    assert multiplier == (32**-0.5 if version == "1.0" else 1.0)
    torch.testing.assert_close(run.hidden, out.decoder_hidden_states[-1] * multiplier, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batches_equal_single_pairs(pair, side):
    _, _, model = pair
    sources, targets = _ids(3, (3, 30)), _ids(4, (3, 12))
    source_lengths, target_lengths = [30, 7, 19], [12, 3, 8]
    batch_targets = _padded(targets, target_lengths, side)
    run = model.run(_padded(sources, source_lengths, side), batch_targets)
    for i in range(3):
        alone = model.run(sources[i : i + 1, : source_lengths[i]], targets[i : i + 1, : target_lengths[i]])
        real = batch_targets.attention_mask[i]
        torch.testing.assert_close(run.logits[i][real], alone.logits[0], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("n_buckets, max_distance", [(32, 128), (10, 24), (7, 300), (4, 3)])
def test_buckets_equal_transformers_up_to_300_positions(bidirectional, n_buckets, max_distance):
    relative = torch.arange(-300, 301)[None, :] - torch.arange(0, 301)[:, None]  # every key - query up to 300
    expected = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=n_buckets, max_distance=max_distance)
    assert torch.equal(relative_buckets(relative, bidirectional, n_buckets, max_distance), expected)


def test_a_layers_bias_equals_transformers_compute_bias(pair):
    """The bias itself, for 300 queries and keys, in the encoder (bidirectional) and the decoder (causal), of
    every layer (umT5's differ; T5's share layer 0's)."""
    version, hf, model = pair
    positions = torch.arange(300)[None]
    for ours, theirs in ((model.encoder, hf.encoder), (model.decoder, hf.decoder)):
        for layer in range(len(theirs.block)):
            attention = theirs.block[layer if version == "umt5" else 0].layer[0].SelfAttention
            expected = attention.compute_bias(300, 300, device=torch.device("cpu"))
            bias = ours.relative.bias(layer, ours.relative.buckets(positions, positions), None, torch.float32)
            torch.testing.assert_close(bias, expected, atol=0, rtol=0)


def test_decoder_components_sum_to_the_final_state_and_attribution_to_the_logit(pair):
    _, _, model = pair
    sources, targets = _ids(5, (2, 14)), _ids(6, (2, 6))
    run = model.run(sources, targets)
    sites, pieces = run.stream.components()
    final = run.stream.final()
    assert torch.linalg.vector_norm(pieces.sum(0) - final) <= 1e-5 * torch.linalg.vector_norm(final)
    assert resid.Site(2, "cross") in sites
    for level in ("sublayer", "head", "neuron"):
        df = attribution.direct(model, targets, source=sources, level=level)
        by_prompt = df.groupby("prompt_idx")
        error = (by_prompt["value"].sum() - by_prompt["logit"].first()).abs()
        assert (error <= 1e-5 * (1 + by_prompt["logit"].first().abs())).all(), (level, error)
        if level == "head":
            assert df.site.str.contains(r"\.cross\.head\[3\]").sum() == 2 * 3  # prompts x decoder layers
    logits = run.logits[:, -1]
    first = df.groupby("prompt_idx")["logit"].first().to_numpy()
    torch.testing.assert_close(torch.tensor(first, dtype=torch.float32), logits.max(-1).values, atol=1e-5, rtol=0)


def test_a_cross_head_ablation_matches_a_transformers_hook(pair):
    _, hf, model = pair
    sources, targets = _ids(7, (2, 11)), _ids(8, (2, 5))
    attention = hf.decoder.block[1].layer[1].EncDecAttention
    handle = attention.o.register_forward_pre_hook(
        lambda m, args: (args[0].view(*args[0].shape[:2], 4, 6).index_fill(2, torch.tensor([2]), 0.0).flatten(2),))
    try:
        expected = references(hf, sources, targets).logits
    finally:
        handle.remove()
    ablated = model.run(sources, targets, interventions=[resid.ZeroAblate(resid.Site(1, "cross", head=2))]).logits
    torch.testing.assert_close(ablated, expected, atol=ATOL, rtol=RTOL)


def test_the_pattern_includes_the_relative_bias(pair):
    _, hf, model = pair
    sources, targets = _ids(9, (1, 9)), _ids(10, (1, 7))
    with torch.no_grad():
        out = hf(input_ids=sources, decoder_input_ids=targets, output_attentions=True)
    run = model.run(sources, targets, capture=resid.Capture.all(), encoder_capture=resid.Capture.all())
    for layer in range(2):
        torch.testing.assert_close(run.encoder.stream.layers[layer].attn.pattern, out.encoder_attentions[layer],
                                   atol=1e-5, rtol=1e-4)
    for layer in range(3):
        torch.testing.assert_close(run.stream.layers[layer].attn.pattern, out.decoder_attentions[layer],
                                   atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(run.stream.layers[layer].cross.pattern, out.cross_attentions[layer],
                                   atol=1e-5, rtol=1e-4)


# The published configs of t5-small (v1.0) and flan-t5-small (v1.1), at their kinds of values
T5_SMALL = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64, "d_model": 512,
    "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1, "initializer_factor": 1.0,
    "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512,
    "num_heads": 8, "num_layers": 6, "output_past": True, "pad_token_id": 0, "relative_attention_num_buckets": 32,
    "task_specific_params": {"translation_en_to_de": {"prefix": "translate English to German: "}},
    "vocab_size": 32128,
}
FLAN_T5_SMALL = {
    **T5_SMALL, "d_ff": 1024, "dense_act_fn": "gelu_new", "feed_forward_proj": "gated-gelu", "is_gated_act": True,
    "num_decoder_layers": 8, "num_heads": 6, "num_layers": 8, "relative_attention_max_distance": 128,
    "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": "4.23.1", "use_cache": True,
}


def _folder(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("config", [T5_SMALL, FLAN_T5_SMALL, {**FLAN_T5_SMALL, "model_type": "mt5"}])
def test_published_configs_are_known(tmp_path: Path, config: dict):
    with pytest.raises(resid.ResidError, match="no model.safetensors"):  # the config itself was accepted
        resid.load(_folder(tmp_path, config))


@pytest.mark.parametrize("change, message", [
    ({"feed_forward_proj": "relu-gated"}, "not 'ACT' or 'gated-ACT'"),
    ({"feed_forward_proj": "gated-tanh"}, "Activation 'tanh' is not supported"),
    ({"is_encoder_decoder": False}, "is_encoder_decoder=false"),
    ({"relative_attention_num_buckets": 1}, "relative_attention_num_buckets must be a whole number of at least 2"),
    ({"relative_attention_num_buckets": 3}, "at least 4 relative_buckets"),
    ({"use_new_positions": True}, "use_new_positions"),
])
def test_variants_resid_does_not_compute_are_refused(tmp_path: Path, change: dict, message: str):
    with pytest.raises(resid.ResidError, match=message):
        resid.load(_folder(tmp_path, {**T5_SMALL, **change}))


def test_a_checkpoint_missing_the_bias_table_says_which_tensor(tmp_path: Path):
    t5(tmp_path, "1.0")
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(resid.ResidError, match=r"has no tensor 'encoder\.block\.0\.layer\.0\.SelfAttention\."
                                               r"relative_attention_bias\.weight'.*re-export it"):
        resid.load(tmp_path)
