"""ablation.sweep(model, prompts, ..., source=...) on encoder-decoder models: each row equals one forward with a
hand-written torch hook on the Hugging Face Marian model (decoder self-attention heads, cross-attention heads,
decoder MLPs, encoder heads, encoder MLPs), or an explicit intervention run (mean and resample values computed by
hand; the original post-LN Transformer); a batch equals its prompts one at a time; bad input says what to pass."""

import pandas as pd
import pytest
import torch
from random_models import make_random_model
from seq2seq_models import PAD
from seq2seq_words import worded_marian

import resid
from resid import Site
from resid.analyses import Execution, ablation
from resid.errors import ResidError

SOURCES = torch.randint(1, PAD, (3, 7), generator=torch.Generator().manual_seed(31))
TARGETS = torch.randint(1, PAD, (3, 4), generator=torch.Generator().manual_seed(32))
TARGET = 5
SITES = ["layers[0].attn.head[1]", "layers[2].cross.head[0]", "layers[1].mlp", "encoder.layers[1].attn.head[2]",
         "encoder.layers[0].mlp", "encoder.layers[1]"]


def _hf_logit(tiny_marian, hooks) -> torch.Tensor:
    """The target's logit at the last position of the Hugging Face model with these (module, hook, pre) hooks."""
    handles = [(m.register_forward_pre_hook if pre else m.register_forward_hook)(fn) for m, fn, pre in hooks]
    try:
        with torch.no_grad():
            return tiny_marian.hf(input_ids=SOURCES, decoder_input_ids=TARGETS).logits[:, -1, TARGET]
    finally:
        for handle in handles:
            handle.remove()


def _zero_head(head: int, d_head: int):
    def hook(module, inputs):
        z = inputs[0].clone()
        z[..., head * d_head : (head + 1) * d_head] = 0
        return (z,)

    return hook


def _hooks(tiny_marian, label: str) -> list:
    """Hand-written hooks on the Hugging Face modules that zero what `label` names."""
    hf, model = tiny_marian.hf.model, tiny_marian.model
    zero = lambda module, inputs, output: torch.zeros_like(output)  # noqa: E731
    site = Site.parse(label)
    stack = hf.encoder if site.stack else hf.decoder
    layer = stack.layers[site.layer]
    d_head = (model.encoder if site.stack else model.decoder).config.d_head
    if site.part == "layer":
        return [(layer.self_attn, lambda m, i, out: (torch.zeros_like(out[0]), *out[1:]), False),
                (layer.fc2, zero, False)]
    if site.part == "mlp":
        return [(layer.fc2, zero, False)]
    attention = layer.encoder_attn if site.part == "cross" else layer.self_attn
    return [(attention.out_proj, _zero_head(site.head, d_head), True)]


def test_zero_ablation_equals_a_torch_hook_per_site(tiny_marian):
    df = ablation.sweep(tiny_marian.model, TARGETS, TARGET, sites=SITES, source=SOURCES, metric="logit",
                        execution=Execution(batch_size=2))
    assert df["site"].unique().tolist() == SITES
    clean = _hf_logit(tiny_marian, [])
    for label in SITES:
        rows = df[df.site == label].sort_values("prompt_idx")
        expected = _hf_logit(tiny_marian, _hooks(tiny_marian, label))
        assert (expected - clean).abs().max() > 1e-3, label  # each ablation changes the prediction
        torch.testing.assert_close(torch.tensor(rows.ablated_metric.to_numpy(), dtype=torch.float32), expected,
                                   atol=1e-4, rtol=1e-4, msg=label)
        torch.testing.assert_close(torch.tensor(rows.clean_metric.to_numpy(), dtype=torch.float32), clean,
                                   atol=1e-4, rtol=1e-4)


def test_words_span_both_stacks(tiny_marian):
    model = tiny_marian.model
    df = ablation.sweep(model, TARGETS[:1], TARGET, sites="head", source=SOURCES[:1])
    encoder, decoder = model.encoder.config, model.decoder.config
    assert len(df) == encoder.n_layers * encoder.n_heads + decoder.n_layers * 2 * decoder.n_heads
    assert df.site.iloc[0] == "encoder.layers[0].attn.head[0]"
    assert {"layers[0].attn.head[0]", "layers[2].cross.head[1]"} <= set(df.site)
    sublayers = ablation.sweep(model, TARGETS[:1], TARGET, sites="sublayer", source=SOURCES[:1])
    assert sublayers.site.tolist()[:2] == ["encoder.layers[0].attn", "encoder.layers[0].mlp"]
    assert "layers[1].cross" in set(sublayers.site)


def _read(model, label: str, source, target) -> torch.Tensor:
    site = Site.parse(label)
    run = model.run(source, target, capture=resid.Capture.of([site]),
                    encoder_capture=resid.Capture.of([Site.parse(label.removeprefix("encoder."))]))
    return run.read(site)


def test_the_means_over_the_pairs_are_a_driver_job_with_its_progress(tiny_marian, monkeypatch, capsys):
    """The means over the pairs run on the driver, so the sweep's progress shows them: a line per chunk of pairs
    (batch_size pairs each), counting every pair; progress=False silences them with the rows."""
    from resid.analyses.distributed import progress

    monkeypatch.setattr(progress, "LINE_EVERY", 0.0)
    sites = ["encoder.layers[0].mlp", "layers[1].mlp"]
    ablation.sweep(tiny_marian.model, TARGETS, TARGET, sites=sites, source=SOURCES, method="mean",
                   execution=Execution(batch_size=2))
    means = [line for line in capsys.readouterr().err.splitlines() if line.startswith("means over the pairs")]
    assert len(means) == 3 and means[-1].startswith("means over the pairs (2 chunks): done, 3 pairs in "), means
    ablation.sweep(tiny_marian.model, TARGETS, TARGET, sites=sites, source=SOURCES, method="mean",
                   execution=Execution(batch_size=2, progress=False))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("per_position", [False, True])
def test_mean_ablation_uses_the_mean_over_the_pairs_of_each_side(tiny_marian, per_position):
    model = tiny_marian.model
    sites = ["encoder.layers[0].attn.head[1]", "layers[1].cross.head[1]", "encoder.layers[1].mlp"]
    df = ablation.sweep(model, TARGETS, TARGET, sites=sites, source=SOURCES, method="mean", metric="logit",
                        mean_positions="per_position" if per_position else "agnostic")
    for label in sites:
        value = _read(model, label, SOURCES, TARGETS)  # [pairs pos ...], no padding
        mean = value.mean(0, keepdim=True) if per_position else value.mean((0, 1), keepdim=True)
        logits = model.run(SOURCES, TARGETS, interventions=[resid.Replace(Site.parse(label), mean)]).logits
        got = torch.tensor(df[df.site == label].sort_values("prompt_idx").ablated_metric.to_numpy())
        torch.testing.assert_close(got.float(), logits[:, -1, TARGET], atol=1e-4, rtol=1e-4, msg=label)


def test_resample_ablation_takes_the_other_pairs_value(tiny_marian):
    model = tiny_marian.model
    sources, targets = SOURCES[:2], TARGETS[:2]  # two pairs of equal lengths: each is the other's donor
    sites = ["encoder.layers[1].attn.head[0]", "layers[0].cross.head[1]", "layers[2].mlp", "encoder.layers[0].mlp"]
    df = ablation.sweep(model, targets, TARGET, sites=sites, source=sources, method="resample", metric="logit")
    for label in sites:
        donor = _read(model, label, sources, targets).flip(0)
        logits = model.run(sources, targets, interventions=[resid.Replace(Site.parse(label), donor)]).logits
        got = torch.tensor(df[df.site == label].sort_values("prompt_idx").ablated_metric.to_numpy())
        torch.testing.assert_close(got.float(), logits[:, -1, TARGET], atol=1e-4, rtol=1e-4, msg=label)


def test_the_original_transformer_equals_its_intervention_runs(original):
    _, model = original
    sources, targets = SOURCES % model.config.d_vocab, TARGETS % model.config.d_vocab
    sites = ["encoder.layers[0].attn.head[3]", "encoder.layers[1].mlp", "layers[1].cross.head[2]", "layers[0].mlp",
             "layers[1].attn.head[0]"]
    df = ablation.sweep(model, targets, TARGET, sites=sites, source=sources, metric="logit")
    for label in sites:
        logits = model.run(sources, targets, interventions=[resid.ZeroAblate(Site.parse(label))]).logits
        got = torch.tensor(df[df.site == label].sort_values("prompt_idx").ablated_metric.to_numpy())
        torch.testing.assert_close(got.float(), logits[:, -1, TARGET], atol=1e-4, rtol=1e-4, msg=label)


@pytest.fixture(scope="module")
def worded(tmp_path_factory):
    return worded_marian(tmp_path_factory.mktemp("worded"))[1]


def test_a_padded_batch_equals_its_pairs_one_at_a_time(worded):
    sources = ["w3 w9 w14 w2 w40", "w7 w8", "w11 w30 w5"]
    targets = ["w4 w21", "w9 w13 w2 w17", "w33"]
    sites = ["encoder.layers[0].attn.head[2]", "encoder.layers[1].mlp", "layers[1].cross.head[0]", "layers[2].mlp",
             "encoder.layers[0].resid_pre@-1", "layers[0].resid_pre@0"]
    batch = ablation.sweep(worded, targets, "w7", sites=sites, source=sources, metric="logit")
    for i in range(3):
        alone = ablation.sweep(worded, targets[i : i + 1], "w7", sites=sites, source=sources[i : i + 1],
                               metric="logit")
        mine = batch[batch.prompt_idx == i]
        assert mine.site.tolist() == alone.site.tolist() == sites
        torch.testing.assert_close(torch.tensor(mine.ablated_metric.to_numpy()),
                                   torch.tensor(alone.ablated_metric.to_numpy()), atol=1e-4, rtol=1e-4)


def test_a_resumed_sweep_checks_its_sources(tiny_marian, tmp_path):
    out = tmp_path / "sweep.parquet"
    first = ablation.sweep(tiny_marian.model, TARGETS, TARGET, sites=SITES[:2], source=SOURCES,
                           execution=Execution(out=out))
    again = ablation.sweep(tiny_marian.model, TARGETS, TARGET, sites=SITES[:2], source=SOURCES,
                           execution=Execution(out=out))
    torch.testing.assert_close(torch.tensor(first.delta.to_numpy()), torch.tensor(again.delta.to_numpy()))
    with pytest.raises(ResidError, match="signature|different"):
        ablation.sweep(tiny_marian.model, TARGETS, TARGET, sites=SITES[:2], source=SOURCES.flip(0),
                       execution=Execution(out=out))


def test_bad_input_says_what_to_pass(tiny_marian, gpt2_tokenizer):
    model = tiny_marian.model
    decoder_only = make_random_model("gpt2_like", gpt2_tokenizer)
    with pytest.raises(ResidError, match="encoder-decoder model: pass source="):
        ablation.sweep(model, TARGETS, TARGET)
    with pytest.raises(ResidError, match="2 sources for 3 prompts"):
        ablation.sweep(model, TARGETS, TARGET, source=SOURCES[:2])
    with pytest.raises(ResidError, match="source= is for encoder-decoder models"):
        ablation.sweep(decoder_only, ["hello"], " world", source=["bonjour"])
    with pytest.raises(ResidError, match="this model has no encoder"):
        ablation.sweep(decoder_only, ["hello"], " world", sites=["encoder.layers[0].mlp"])
    with pytest.raises(ResidError, match=r"encoder\.layers\[7\]\.mlp: layer 7 is out of range"):
        ablation.sweep(model, TARGETS, TARGET, sites=["encoder.layers[7].mlp"], source=SOURCES)
    with pytest.raises(ResidError, match="take no reference texts"):
        ablation.sweep(model, TARGETS, TARGET, method="mean", reference=["w1 w2"], source=SOURCES)
    with pytest.raises(ResidError, match="in process for now"):
        ablation.sweep(model, TARGETS, TARGET, source=SOURCES, execution=Execution(executor="ray", workers=2))
    # "inprocess" (as resid.analyses.distributed.resolve spells the default) is in process: the same rows
    in_process = ablation.sweep(model, TARGETS[:1], TARGET, sites="head", source=SOURCES[:1],
                                execution=Execution(executor="inprocess"))
    pd.testing.assert_frame_equal(in_process, ablation.sweep(model, TARGETS[:1], TARGET, sites="head",
                                                             source=SOURCES[:1]))
    with pytest.raises(ResidError, match="dictionaries are not taken with encoder-decoder models"):
        ablation.sweep(model, TARGETS, TARGET, source=SOURCES, dictionaries=[object()])
    with pytest.raises(ResidError, match="draws its donors among the pairs"):
        ablation.sweep(model, TARGETS, TARGET, method="resample", reference=["w1 w2"] * 3, source=SOURCES)
