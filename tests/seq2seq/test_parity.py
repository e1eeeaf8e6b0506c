"""Encoder-decoder parity (fp32): the original Transformer against torch.nn.Transformer with the 2017 embedding
and positions, and Marian against Hugging Face's MarianMTModel, every layer of both streams and the logits,
with padded sources; padding never changes a pair's numbers."""

import pytest
import torch
from seq2seq_models import PAD, VOCAB

import resid

ATOL = 1e-4


def _ids(seed: int, shape: tuple[int, int], high: int) -> torch.Tensor:
    return torch.randint(1, high, shape, generator=torch.Generator().manual_seed(seed))


def _padded(ids: torch.Tensor, lengths: list[int], side: str = "right", pad: int = PAD) -> resid.Tokens:
    return resid.Tokens.pad([row[:n].tolist() for row, n in zip(ids, lengths)], pad, side)


def test_original_transformer_matches_nn_transformer(original):
    reference, model = original
    source, target = _ids(0, (3, 9), VOCAB), _ids(1, (3, 6), VOCAB)
    seen = {}
    hooks = [layer.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(("enc", i), out))
             for i, layer in enumerate(reference.core.encoder.layers)]
    hooks += [layer.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(("dec", i), out))
              for i, layer in enumerate(reference.core.decoder.layers)]
    try:
        with torch.no_grad():
            expected = reference(source, target)
    finally:
        for hook in hooks:
            hook.remove()
    run = model.run(source, target, encoder_capture=resid.Capture())
    torch.testing.assert_close(run.logits, expected, atol=ATOL, rtol=0)
    for layer in range(2):
        torch.testing.assert_close(run.encoder.stream.resid_post(layer), seen[("enc", layer)], atol=ATOL, rtol=0)
        torch.testing.assert_close(run.stream.resid_post(layer), seen[("dec", layer)], atol=ATOL, rtol=0)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # nn.Transformer's fast path
def test_original_transformer_masks_source_padding(original):
    reference, model = original
    source, target = _ids(2, (2, 8), VOCAB), _ids(3, (2, 5), VOCAB)
    lengths = [8, 5]
    padded = _padded(source, lengths, pad=0)
    with torch.no_grad():
        expected = reference(padded.ids, target, source_padding=~padded.attention_mask)
    torch.testing.assert_close(model.run(padded, target).logits, expected, atol=ATOL, rtol=0)


def test_marian_matches_transformers_layer_by_layer(tiny_marian):
    hf, model = tiny_marian.hf, tiny_marian.model
    assert isinstance(model, resid.EncoderDecoder)
    assert (model.encoder.config.n_heads, model.decoder.config.n_heads, model.decoder.config.n_layers) == (4, 2, 3)
    source = _padded(_ids(4, (3, 9), PAD), [9, 6, 3])
    target = _ids(5, (3, 6), PAD)
    target[:, 0] = PAD  # decoder_start_token_id
    with torch.no_grad():
        out = hf(input_ids=source.ids, attention_mask=source.attention_mask.long(), decoder_input_ids=target,
                 output_hidden_states=True)
    run = model.run(source, target, encoder_capture=resid.Capture())
    torch.testing.assert_close(run.logits, out.logits, atol=ATOL, rtol=0)
    real = source.attention_mask
    for layer, hidden in enumerate(out.encoder_hidden_states):
        torch.testing.assert_close(run.encoder.stream.resid_pre(layer)[real], hidden[real], atol=ATOL, rtol=0)
    for layer, hidden in enumerate(out.decoder_hidden_states):
        torch.testing.assert_close(run.stream.resid_pre(layer), hidden, atol=ATOL, rtol=0)


def test_zero_ablating_cross_attention_matches_a_transformers_hook(tiny_marian):
    hf, model = tiny_marian.hf, tiny_marian.model
    source, target = _ids(6, (2, 7), PAD), _ids(7, (2, 4), PAD)
    handle = hf.model.decoder.layers[1].encoder_attn.register_forward_hook(
        lambda m, args, out: (torch.zeros_like(out[0]), *out[1:])
    )
    try:
        with torch.no_grad():
            expected = hf(input_ids=source, decoder_input_ids=target).logits
    finally:
        handle.remove()
    ablated = model.run(source, target, interventions=[resid.ZeroAblate(resid.Site(1, "cross"))]).logits
    torch.testing.assert_close(ablated, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_changes_nothing(tiny_marian, side):
    model = tiny_marian.model
    sources, targets = _ids(8, (3, 9), PAD), _ids(9, (3, 6), PAD)
    source_lengths, target_lengths = [9, 4, 6], [6, 2, 5]
    run = model.run(_padded(sources, source_lengths, side), _padded(targets, target_lengths, side))
    batch_targets = _padded(targets, target_lengths, side)
    for i in range(3):
        alone = model.run(sources[i : i + 1, : source_lengths[i]], targets[i : i + 1, : target_lengths[i]])
        real = batch_targets.attention_mask[i]
        torch.testing.assert_close(run.logits[i][real], alone.logits[0], atol=1e-5, rtol=0)
