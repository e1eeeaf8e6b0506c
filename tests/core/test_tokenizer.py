"""resid.Tokens and resid.Tokenizer: the one padding builder, prompt-relative <-> padded positions, BOS policy."""

import pytest
import torch
from bad_option import BAD_OPTION
from random_models import make_random_model

import resid
from resid.tokenizer import Tokens

SEQUENCES = [[5, 6, 7], [8], [9, 10]]


@pytest.mark.parametrize("side", ["left", "right"])
def test_pad_keeps_each_sequence_contiguous_with_its_own_positions(side):
    tokens = Tokens.pad(SEQUENCES, pad_token_id=0, padding_side=side)
    assert tokens.ids.shape == (3, 3)
    assert tokens.lengths.tolist() == [3, 1, 2]
    for row, seq in enumerate(SEQUENCES):
        real = tokens.ids[row][tokens.attention_mask[row]].tolist()
        assert real == seq
        assert tokens.position_ids[row][tokens.attention_mask[row]].tolist() == list(range(len(seq)))
    first, last = tokens.first_positions().tolist(), tokens.last_positions().tolist()
    assert first == ([0, 2, 1] if side == "left" else [0, 0, 0])
    assert last == ([2, 2, 2] if side == "left" else [2, 0, 1])


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_index_maps_prompt_relative_positions(side):
    tokens = Tokens.pad(SEQUENCES, pad_token_id=0, padding_side=side)
    index = tokens.padded_index([0, -1])
    rows = torch.arange(3)[:, None]
    assert tokens.ids[rows, index].tolist() == [[5, 7], [8, 8], [9, 10]]
    per_prompt = tokens.padded_index([[1], [0], [1]])
    assert tokens.ids[rows, per_prompt].tolist() == [[6], [8], [10]]
    with pytest.raises(resid.ResidError,
                       match=r"Position\(s\) \[1\] are out of range for prompt 1, which has 1 tokens"):
        tokens.padded_index([1])


def test_rows_and_trim_drop_shared_padding():
    tokens = Tokens.pad(SEQUENCES, pad_token_id=0)
    short = tokens.rows([1, 2]).trim()
    assert short.ids.shape == (2, 2)
    assert short.padded_index([-1]).flatten().tolist() == [1, 1]
    whole = tokens.rows([0])
    assert whole.trim() is whole  # nothing to trim: the same batch back


def test_bad_padding_side_is_one_error():
    with pytest.raises(BAD_OPTION, match=r"(?s)padding_side.*'left', 'right'"):
        Tokens.pad(SEQUENCES, 0, "middle")


def test_to_tokens_uses_the_same_padding(gpt2_tokenizer):
    texts = ["Hello world, how are you", "Hi"]
    tokens = gpt2_tokenizer.to_tokens(texts, padding_side="right")
    expected = Tokens.pad([gpt2_tokenizer.encode(t) for t in texts], gpt2_tokenizer.pad_token_id, "right")
    assert torch.equal(tokens.ids, expected.ids) and torch.equal(tokens.position_ids, expected.position_ids)
    with pytest.raises(resid.ResidError, match=r"Prompt\(s\) \[1\] tokenize to nothing"):
        gpt2_tokenizer.to_tokens(["fine", ""])


def test_token_id_takes_the_text_a_prompt_contains(gpt2_tokenizer):
    mary = gpt2_tokenizer.token_id(" Mary")
    assert gpt2_tokenizer.encode(" Mary") == [mary] and gpt2_tokenizer.decode(mary) == " Mary"
    assert gpt2_tokenizer.token_id("<|endoftext|>") == 50256  # special tokens are text too


def test_token_id_refuses_several_tokens_and_shows_the_pieces(gpt2_tokenizer):
    with pytest.raises(resid.ResidError, match=r"' Maryland is' is 2 tokens, \[' Maryland', ' is'\]"):
        gpt2_tokenizer.token_id(" Maryland is")
    # The vocabulary's byte-level spelling is not the text; the error names the text that is.
    with pytest.raises(resid.ResidError, match=r"spelling of token \d+, text ' Mary'"):
        gpt2_tokenizer.token_id("ĠMary")
    with pytest.raises(resid.ResidError, match="non-empty string"):
        gpt2_tokenizer.token_id("")


def test_to_single_token(gpt2_tokenizer):
    model = make_random_model("gpt2_like", gpt2_tokenizer)
    assert model.to_single_token(" Mary") == gpt2_tokenizer.encode(" Mary")[0]
    with pytest.raises(resid.ResidError, match="3 tokens"):
        model.to_single_token("ĠMary")
    with pytest.raises(resid.ResidError, match="no tokenizer"):
        make_random_model("gpt2_like").to_single_token(" Mary")


def test_a_lone_surrogate_is_one_clear_error(gpt2_tokenizer):
    # issue 27: tokenizers raised "TypeError: TextInputSequence must be str"
    with pytest.raises(resid.ResidError, match=r"holds a lone surrogate U\+D83D at character 5: half of a UTF-16 pair"):
        gpt2_tokenizer.to_tokens(["fine", "half \ud83d of an emoji"])
    assert gpt2_tokenizer.encode("a whole \U0001F600") == gpt2_tokenizer.encode("a whole \ud83d\ude00".encode(
        "utf-16", "surrogatepass").decode("utf-16"))
