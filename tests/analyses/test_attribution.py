"""Direct attribution: completeness (rows sum to the model's logit) on every architecture and on SmolLM2,
per-head and per-neuron values against a brute force that materializes each write, padding invariance,
per-prompt targets with some left to the top prediction, the leading-space hints, and bad input."""

import pytest
import torch
from bad_option import BAD_OPTION
from random_models import make_random_model
from tiny_fixtures import Tiny

import resid
from resid.analyses import attribution, logit_lens
from resid.analyses.vocab import single_token_id, spacing_hint, token_ids

PROMPTS = ["The quick brown fox jumps over the lazy", "A short one", "Residual streams are sums of writes into"]
LEVELS = ("sublayer", "head", "neuron")


def _assert_complete(df, rel=1e-5):
    sums = df.groupby("prompt_idx").agg(total=("value", "sum"), logit=("logit", "first"))
    err = ((sums["total"] - sums["logit"]).abs() / sums["logit"].abs().clip(lower=1.0)).max()
    assert err < rel, sums


@pytest.mark.parametrize("level", LEVELS)
def test_rows_sum_to_the_logit_on_every_family(tiny: Tiny, level):
    _assert_complete(attribution.direct(tiny.model, PROMPTS, targets=" the", level=level))
    _assert_complete(attribution.direct(tiny.model, PROMPTS, targets=" the", baselines=" a", level=level, position=2))


@pytest.mark.parametrize("level", LEVELS)
def test_rows_sum_to_the_logit_on_random_architectures(random_model, level):
    df = attribution.direct(random_model, PROMPTS, targets=None, baselines=" a", level=level)
    _assert_complete(df)
    # The actual logit difference is the model's own (before its final soft cap, if it has one).
    run = random_model.run(PROMPTS[1], logits_at="last")
    row = df[df.prompt_idx == 1].iloc[0]

    def difference(logits):
        return (logits[0, 0, row["target_id"]] - logits[0, 0, row["baseline_id"]]).item()

    capped = run.uncapped_logits is not None
    assert row["logit"] == pytest.approx(difference(run.uncapped_logits if capped else run.logits), abs=1e-5)
    assert ("logit_capped" in df) == capped
    if capped:
        assert row["logit_capped"] == pytest.approx(difference(run.logits), abs=1e-5)
        assert any("soft-caps" in note for note in df.attrs["notes"])


def test_rows_sum_to_the_logit_on_smollm2(smollm2):
    prompts = ["The Eiffel Tower is located in the city of",
               "When Mary and John went to the store, John gave a drink to"]
    for level in LEVELS:
        _assert_complete(attribution.direct(smollm2, prompts, targets=None, level=level))
    df = attribution.direct(smollm2, prompts[1], targets=" Mary", baselines=" John", level="head")
    _assert_complete(df)
    assert df["logit"].iloc[0] > 0  # the model prefers the indirect object


def test_levels_refine_each_other(random_model):
    sub = attribution.direct(random_model, PROMPTS, " the", level="sublayer").set_index(["prompt_idx", "site"])
    fine = attribution.direct(random_model, PROMPTS, " the", level="neuron")
    grouped = fine[fine.layer.notna()].groupby(["prompt_idx", "layer", "part"])["value"].sum()
    for (prompt, layer, part), value in grouped.items():
        assert value == pytest.approx(sub.loc[(prompt, f"layers[{layer}].{part}"), "value"], abs=1e-5)


@torch.no_grad()
def _brute_force(model, text, target, level):
    """Every head's and neuron's write materialized in d_model, then sent through the final norm with its
    scale frozen and dotted with the unembedding column: no folded direction involved."""
    run = model.run(text, capture=resid.Capture.all())
    stream, last = run.stream, run.tokens.last_positions()[0]
    scale = stream.final_norm_scale[0, last]
    ln = model.ln_final

    def logit_of(write):  # [..., d_model]
        if ln.centre:
            write = write - write.mean(-1, keepdim=True)
        return (write * scale * ln.gain) @ model.unembed.W_U[:, target]

    def through_post_norm(norm, record, writes):  # RMSNorm post-norms (Gemma, OLMo 2): no bias
        if norm is None:
            return writes
        return norm(writes, scale=record.post_norm_scale[0, last].expand(len(writes), 1))[0]

    values = {}
    for layer, record in enumerate(stream.layers):
        block = model.blocks[layer]
        if level == "head":
            z = record.attn.z[0, last]  # [head d_head]
            writes = torch.stack([z[h] @ block.attn.W_O[h] for h in range(z.shape[0])])
            writes = through_post_norm(block.ln_attn_post, record.attn, writes)
            for h, v in enumerate(logit_of(writes).tolist()):
                values[f"layers[{layer}].attn.head[{h}]"] = v
        else:
            post = record.mlp.post[0, last]
            writes = post[:, None] * block.mlp.W_out  # [d_mlp d_model]
            writes = through_post_norm(block.ln_mlp_post, record.mlp, writes)
            for i, v in enumerate(logit_of(writes).tolist()):
                values[f"layers[{layer}].mlp.neuron[{i}]"] = v
    return values


@pytest.mark.parametrize("level", ["head", "neuron"])
def test_projected_values_equal_brute_force(random_model, level):
    text, target = PROMPTS[0], single_token_id(random_model, " the")
    expected = _brute_force(random_model, text, target, level)
    df = attribution.direct(random_model, text, target, level=level).set_index("site")
    got = df.loc[list(expected), "value"]
    torch.testing.assert_close(torch.tensor(got.values), torch.tensor(list(expected.values()), dtype=torch.float64),
                               atol=1e-5, rtol=1e-5)


def test_head_values_on_smollm2_equal_brute_force(smollm2):
    text = "The Eiffel Tower is located in the city of"
    target = single_token_id(smollm2, " Paris")
    expected = _brute_force(smollm2, text, target, "head")
    df = attribution.direct(smollm2, text, " Paris", level="head").set_index("site")
    got = torch.tensor(df.loc[list(expected), "value"].values)
    torch.testing.assert_close(got, torch.tensor(list(expected.values()), dtype=torch.float64), atol=1e-4, rtol=1e-4)


def test_a_prompt_in_a_padded_batch_equals_the_prompt_alone(random_model):
    batch = attribution.direct(random_model, PROMPTS, " the", level="head", position=1)
    for i, text in enumerate(PROMPTS):
        alone = attribution.direct(random_model, text, " the", level="head", position=1)
        mine = batch[batch.prompt_idx == i].reset_index(drop=True)
        assert list(mine["site"]) == list(alone["site"])
        torch.testing.assert_close(torch.tensor(mine["value"].values), torch.tensor(alone["value"].values),
                                   atol=1e-5, rtol=1e-5)
        assert mine["token"].iloc[0] == random_model.to_str_tokens(text)[1]


def test_batch_size_does_not_change_results(random_model):
    one = attribution.direct(random_model, PROMPTS, " the", level="neuron", batch_size=1)
    auto = attribution.direct(random_model, PROMPTS, " the", level="neuron")
    torch.testing.assert_close(torch.tensor(one["value"].values), torch.tensor(auto["value"].values),
                               atol=1e-5, rtol=1e-5)


def test_components_and_columns(smollm2):
    df = attribution.direct(smollm2, "The Eiffel Tower is located in the city of", level="head")
    cfg = smollm2.config
    assert len(df) == 1 + cfg.n_layers * (cfg.n_heads + 1) + 1  # embed, heads + MLP per layer, final_bias
    assert df["site"].iloc[0] == "embed" and df["site"].iloc[-1] == "final_bias"
    assert df["target"].iloc[0] == " Paris" and df["token"].iloc[0] == " of"
    assert df["baseline"].isna().all() and df["final_bias" == df.site]["value"].eq(0).all()
    assert df.attrs["provenance"]["analysis"] == "attribution.direct"
    assert df.attrs["provenance"]["parameters"] == {"level": "head", "position": -1}


def test_learned_positions_and_biases_have_their_rows(gpt2_tokenizer):
    from random_models import make_random_model

    model = make_random_model("gpt2_like", gpt2_tokenizer)
    df = attribution.direct(model, PROMPTS[0], " the", level="neuron")
    components = set(df["site"])
    assert {"pos_embed", "layers[0].attn.b_O", "layers[2].mlp.b_out", "final_bias"} <= components
    assert df.set_index("site").loc["final_bias", "value"] != 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(targets=" Parisian"), "is 2 tokens"),
        (dict(targets=10**6), "is not a token"),
        (dict(targets=" Paris", baselines=" Eiffel Tower"), "baseline ' Eiffel Tower' is"),
        (dict(targets=" Paris", position=50), "out of range for prompt 0"),
    ],
)
def test_bad_input_is_one_clear_error(smollm2, kwargs, message):
    with pytest.raises(resid.ResidError, match=message):
        attribution.direct(smollm2, "The Eiffel Tower is located in the city of", **kwargs)


def test_bad_level_names_the_option(smollm2):
    with pytest.raises(BAD_OPTION, match=r"(?s)level.*'sublayer', 'head', 'neuron'"):
        attribution.direct(smollm2, "The Eiffel Tower is located in the city of", " Paris", level="layer")


def test_empty_prompt_is_a_clear_error(smollm2):
    # The one rule of model.run: a prompt is empty when it tokenizes to nothing (whitespace is text).
    with pytest.raises(resid.ResidError, match=r"Prompt\(s\) \[1\] tokenize to nothing"):
        attribution.direct(smollm2, ["fine", ""], " Paris")


def test_per_prompt_targets_may_leave_some_to_the_top_prediction(gpt2_tokenizer):
    model = make_random_model("gpt2_like", gpt2_tokenizer)
    df = attribution.direct(model, PROMPTS, targets=[" the", None, 11], baselines=" a", level="head")
    _assert_complete(df)
    for i, target in enumerate([" the", None, 11]):
        alone = attribution.direct(model, PROMPTS[i], targets=target, baselines=" a", level="head")
        rows = df[df.prompt_idx == i].reset_index(drop=True)
        assert rows["target_id"].iloc[0] == alone["target_id"].iloc[0]
        assert rows["value"].to_numpy() == pytest.approx(alone["value"].to_numpy(), abs=1e-5)
    top = model.run(PROMPTS[1], logits_at="last").logits[0, 0].argmax().item()
    assert df[df.prompt_idx == 1]["target_id"].iloc[0] == top
    # Analyses that need every target (ablation.sweep checks its targets this way) name the prompt without one.
    with pytest.raises(resid.ResidError, match=r"target of prompt 1 \(counting from 0\) is missing"):
        token_ids(model, [" the", None, 11], 3, "target")


def _spaced_paris_model(gpt2_tokenizer, boost: float) -> resid.Transformer:
    """A random model whose unembedding bias makes ' Paris' (id 6342) likely by `boost` logits."""
    model = make_random_model("gpt2_like", gpt2_tokenizer)
    with torch.no_grad():
        model.unembed.b_U[6342] += boost
    return model


def test_an_unspaced_target_gets_a_note_when_the_spaced_form_is_far_likelier(gpt2_tokenizer):
    model = _spaced_paris_model(gpt2_tokenizer, boost=30.0)
    prompt = "The Eiffel Tower is in"
    df = attribution.direct(model, prompt, targets="Paris")
    assert df["target"].iloc[0] == "Paris"  # accepted as given
    [note] = df.attrs["notes"]
    assert "'Paris' (id 40313)" in note and "' Paris' (id 6342, with a leading space)" in note
    lens = logit_lens.run(model, [prompt, prompt], targets="Paris", k=1)
    assert [n.split(":")[0] for n in lens.attrs["notes"]] == ["prompt 0", "prompt 1"]
    # No note for the spaced target, an id, the top prediction, or when the spaced form is not far likelier.
    assert attribution.direct(model, prompt, targets=" Paris").attrs["notes"] == []
    assert attribution.direct(model, prompt, targets=40313).attrs["notes"] == []
    assert logit_lens.run(model, prompt, k=1).attrs["notes"] == []
    plain = _spaced_paris_model(gpt2_tokenizer, boost=0.0)
    logits = plain.run(prompt, logits_at="last").logits[0, 0]
    assert logits.softmax(-1)[6342] < 10 * logits.softmax(-1)[40313]  # this random model has no preference
    assert attribution.direct(plain, prompt, targets="Paris").attrs["notes"] == []


def test_spacing_hint_threshold(gpt2_tokenizer):
    model = make_random_model("gpt2_like", gpt2_tokenizer)
    logits = torch.zeros(model.config.d_vocab)
    assert spacing_hint(model, "Paris", logits) is None  # equally likely
    logits[6342] = torch.log(torch.tensor(10.0))  # exactly HINT_RATIO times likelier
    assert "pass ' Paris'" in spacing_hint(model, "Paris", logits)
    assert spacing_hint(model, " Paris", logits) is None and spacing_hint(model, 40313, logits) is None
    assert spacing_hint(model, "😀", logits) is None  # " 😀" is two tokens


@pytest.mark.parametrize("target, hint", [
    ("Tokyo", "with a leading space, ' Tokyo' is one token (id 11790)"),  # 'Tokyo' is 2 tokens, ' Tokyo' one
    ("😀", None),  # ' 😀' is 2 tokens as well: the space would not help
    (" Eiffel Tower", None),  # already spaced
])
def test_the_multi_token_error_mentions_the_space_only_where_it_helps(gpt2_tokenizer, target, hint):
    model = make_random_model("gpt2_like", gpt2_tokenizer)
    with pytest.raises(resid.ResidError, match="must be one token") as error:
        single_token_id(model, target)
    message = str(error.value)
    assert (hint in message) if hint is not None else ("leading space" not in message)
