"""Exact decomposition of post-LN models: with every norm's scale frozen, the final state is a sum of the writes
carried through the norms after them plus one bias per norm, and attribution to an MLM logit, a probe or a
similarity sums exactly; checked against the frozen-norm chain written out by hand."""

import pytest
import torch
import torch.nn.functional as F

import resid
from resid.analyses import attribution, similarity
from resid.analyses.attribution import Probe
from resid.errors import ResidError

TEXTS = ["Paris is the [MASK] of France.", "the [MASK] sat on the mat", "john gave mary a [MASK] in rome today !"]
LEVELS = ["sublayer", "head", "neuron"]


def _sums(df, tol=1e-5):
    """The rows sum to what they decompose: the logit, a probe's read-out or a similarity."""
    total = next(name for name in ("logit", "readout", "similarity") if name in df)
    by_prompt = df.groupby("prompt_idx")
    error = (by_prompt["value"].sum() - by_prompt[total].first()).abs()
    assert (error <= tol * (1 + by_prompt[total].first().abs())).all(), error


@pytest.mark.parametrize("side", ["left", "right"])
def test_components_sum_to_the_final_state(bert, side):
    run = bert.model.run(bert.model.to_tokens(TEXTS, padding_side=side))
    sites, pieces = run.stream.components()
    labels = [site.label for site in sites]
    final = run.stream.final()
    assert torch.linalg.vector_norm(pieces.sum(0) - final) <= 1e-5 * torch.linalg.vector_norm(final)
    assert labels[:4] == ["embed", "pos_embed", "type_embed", "embed_norm_bias"]
    assert labels[-2:] == ["layers[1].mlp", "layers[1].mlp.resid_norm_bias"]


@pytest.mark.parametrize("level", LEVELS)
def test_mlm_attribution_sums_to_the_logit_at_the_mask(bert_mlm, level):
    model = bert_mlm.model
    df = attribution.direct(model, TEXTS, level=level)
    _sums(df)
    assert (df["token"] == "[MASK]").all() and sorted(df["pos"].unique()) == [2, 4, 5]
    logits = model.run(TEXTS[0], logits_at=[4]).logits[0, 0]
    assert df[df.prompt_idx == 0]["logit"].iloc[0] == pytest.approx(logits.max().item(), abs=1e-5)
    with_baseline = attribution.direct(model, TEXTS, targets="cat", baselines="dog", level=level)
    _sums(with_baseline)


def test_heads_and_neurons_sum_to_their_sublayer(bert_mlm):
    model = bert_mlm.model
    sub = attribution.direct(model, TEXTS, targets="paris", level="sublayer").set_index(["prompt_idx", "site"])
    fine = attribution.direct(model, TEXTS, targets="paris", level="neuron")
    for (prompt, layer, part), rows in fine[fine.layer.notna()].groupby(["prompt_idx", "layer", "part"]):
        parts = rows[~rows.site.str.endswith("resid_norm_bias")]
        expected = sub.loc[(prompt, f"layers[{layer}].{part}"), "value"]
        assert parts["value"].sum() == pytest.approx(expected, abs=1e-5)


def test_a_component_equals_the_frozen_norm_chain_by_hand(bert_mlm):
    """layers[0].attn's contribution to logit('paris') at the mask, recomputed in float64 with every norm's
    scale frozen (LN(x) = g * (x - mean x) * s), the MLM transform's GELU frozen as act(h) / h, and the tied
    decoder row."""
    model = bert_mlm.model
    df = attribution.direct(model, TEXTS[0], targets="paris", level="sublayer").set_index("site")
    run = model.run(TEXTS[0], capture=resid.Capture.all())
    mask, layers = 4, run.stream.layers
    x = layers[0].attn.out[0, mask].double()
    chain = [(model.blocks[0].ln_attn_resid, layers[0].attn), (model.blocks[0].ln_mlp_resid, layers[0].mlp),
             (model.blocks[1].ln_attn_resid, layers[1].attn), (model.blocks[1].ln_mlp_resid, layers[1].mlp)]
    for norm, record in chain:
        x = norm.w.double() * (x - x.mean()) * record.resid_norm_scale[0, mask, 0].double()
    head = model.mlm_head
    hidden = run.hidden[0, mask].double()
    h_full = hidden @ head.W_dense.double() + head.b_dense.double()
    activated = F.gelu(h_full)
    y = (activated / h_full) * (x @ head.W_dense.double())
    s_head = 1 / torch.sqrt(activated.var(unbiased=False) + model.config.norm_eps)
    y = head.ln.w.double() * (y - y.mean()) * s_head
    by_hand = y @ model.embed.W_E[model.to_single_token("paris")].double()
    assert df.loc["layers[0].attn", "value"] == pytest.approx(by_hand.item(), abs=1e-5)


@pytest.mark.parametrize("pool", [None, "mean"])
@pytest.mark.parametrize("level", LEVELS)
def test_probe_and_pooled_probe_sum_exactly(bert_base, pool, level):
    model = bert_base.model
    vector = torch.randn(model.config.d_model, generator=torch.Generator().manual_seed(0))
    texts = [t.replace("[MASK]", "cat") for t in TEXTS]
    df = attribution.direct(model, texts, targets=Probe(vector, bias=0.25, pool=pool), level=level)
    _sums(df)
    hidden = model.run(texts[1]).hidden[0]
    expected = (hidden.mean(0) if pool else hidden[-1]) @ vector + 0.25
    assert df[df.prompt_idx == 1]["readout"].iloc[0] == pytest.approx(expected.item(), abs=1e-5)


@pytest.mark.parametrize("metric", ["cosine", "dot"])
def test_similarity_sums_to_the_similarity(bert_base, metric):
    model = bert_base.model
    texts, others = ["the cat sat on the mat", "paris is cold"], ["a dog sat on a mat", "rome is warm today"]
    df = similarity.similarity(model, texts, others, level="head", metric=metric)
    _sums(df)
    a, b = similarity.embeddings(model, texts, normalize=False), similarity.embeddings(model, others, normalize=False)
    expected = F.cosine_similarity(a, b) if metric == "cosine" else (a * b).sum(-1)
    got = df.groupby("prompt_idx")["similarity"].first().to_numpy()
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float32), expected, atol=1e-5, rtol=0)
    assert list(df.groupby("prompt_idx")["other"].first()) == others


def test_bad_input_says_what_to_do(bert_mlm, bert_base):
    with pytest.raises(ResidError, match=r"0 \[MASK\] tokens.*put one \[MASK\]"):
        attribution.direct(bert_mlm.model, "paris is the capital of france")
    with pytest.raises(ResidError, match=r"2 \[MASK\] tokens"):
        attribution.direct(bert_mlm.model, "[MASK] is the [MASK] of france")
    with pytest.raises(ResidError, match="embedding model.*no unembedding.*Probe"):
        attribution.direct(bert_base.model, "the cat", targets="cat")
    with pytest.raises(ResidError, match="embedding model"):
        bert_base.model.readout.logits(torch.zeros(1, bert_base.model.config.d_model))
    with pytest.raises(ResidError, match="one partner per text"):
        similarity.similarity(bert_base.model, ["a", "b"], ["c"])
