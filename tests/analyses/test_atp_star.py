"""Head-input sites (q, k, v, attention pattern) for exact and attribution patching, and AtP*'s two refinements
(resid.analyses.patching.effects): each checked against an implementation written independently here."""

import pytest
import torch
from bad_option import BAD_OPTION
from random_models import make_random_model

import resid
from resid.analyses import patching
from resid.errors import ResidError

NAMES = [(" Mary", " John"), (" Alice", " Bob")]
CLEAN = [f"When{a} and{b} went to the store,{b} gave a drink to" for a, b in NAMES]
CORRUPT = [f"When{a} and{b} went to the store,{a} gave a drink to" for a, b in NAMES]
TARGETS, BASELINES = [a for a, _ in NAMES], [b for _, b in NAMES]
ALL = resid.Capture(attn={"q", "k", "v", "pattern", "z"})


def _metric(model):
    ids = [(model.to_single_token(a), model.to_single_token(b)) for a, b in NAMES]
    return lambda logits: torch.stack([logits[i, a] - logits[i, b] for i, (a, b) in enumerate(ids)])


def _estimate(model, site: str, kind: str, method: str) -> torch.Tensor:
    df = patching.atp(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=[kind], method=method)
    df = df.set_index(["prompt_idx", "site"])
    return torch.tensor([df.loc[(i, site), "patched_metric"] - df.loc[(i, site), "corrupt_metric"]
                         for i in range(len(NAMES))])


def _assert_linear_limit(model, interventions, estimate) -> None:
    """metric(corrupt run + alpha * edit) - metric(corrupt run), over alpha, tends to `estimate` as alpha shrinks."""
    metric = _metric(model)
    base = metric(model.run(CORRUPT, logits_at="last").logits[:, 0])
    errors = []
    for alpha in (0.3, 0.03, 0.003):
        logits = model.run(CORRUPT, interventions=interventions(alpha), logits_at="last").logits[:, 0]
        errors.append(((metric(logits) - base) / alpha - estimate).abs().max().item())
    assert errors[1] <= max(errors[0] / 3, 1e-3) and errors[2] <= max(errors[1] / 3, 1e-3)
    assert min(errors) < 0.02 * estimate.abs().max().item() + 1e-3


def test_a_replaced_pattern_is_what_the_head_mixes_values_with(random_model):
    layer, head = 1, 2
    tokens = random_model.to_tokens(CORRUPT)
    real = tokens.attention_mask.float()
    uniform = (torch.ones(len(NAMES), 14, 14).tril() * real[:, None, :])
    uniform = uniform / uniform.sum(-1, keepdim=True)
    site = resid.Site(layer, "attn", head=head, field="pattern")
    stream = random_model.run(CORRUPT, capture=ALL, interventions=[resid.Replace(site, uniform)]).stream
    attn = stream.layers[layer].attn
    group = random_model.config.n_heads // random_model.config.n_kv_heads
    expected = uniform @ attn.v[:, :, head // group]
    assert torch.allclose(attn.z[:, :, head], expected, atol=1e-5)
    assert torch.allclose(attn.pattern[:, head], uniform)


def test_attention_pattern_recomputes_the_captured_one(random_model):
    prompts = ["The store", "When Mary and John went to the store"]  # left padding
    stream = random_model.run(prompts, capture=ALL).stream
    for layer, record in enumerate(stream.layers):
        got = random_model.attention_pattern(layer, record.attn.q, record.attn.k, prompts)
        assert torch.allclose(got, record.attn.pattern, atol=1e-6)
    with pytest.raises(ResidError, match="out of range"):
        random_model.attention_pattern(9, record.attn.q, record.attn.k, prompts)


def test_pattern_patching_equals_one_forward_per_site_and_itself_changes_nothing(random_model):
    sites = [resid.Site(0, "attn", head=1, field="pattern"), resid.Site(2, "attn", head=3, field="pattern")]
    df = patching.activation(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=sites)
    df = df.set_index(["prompt_idx", "site"])
    clean = random_model.run(CLEAN, capture=ALL).stream
    metric = _metric(random_model)
    for site in sites:
        value = clean.layers[site.layer].attn.pattern[:, site.head]
        logits = random_model.run(CORRUPT, interventions=[resid.Replace(site, value)], logits_at="last").logits
        expected = metric(logits[:, 0])
        for i in range(len(NAMES)):
            assert df.loc[(i, site.label), "patched_metric"] == pytest.approx(expected[i].item(), abs=1e-5)
    itself = patching.activation(random_model, CLEAN, CLEAN, TARGETS, BASELINES, sites="pattern")
    assert len(itself) == len(NAMES) * random_model.config.n_layers * random_model.config.n_heads
    assert (itself["patched_metric"] - itself["clean_metric"]).abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["q", "k", "v", "pattern"])
def test_atp_of_head_inputs_is_the_linear_limit_of_patching(kind, gpt2_tokenizer):
    """Plain AtP of a head's input: moving it alpha of the way to the clean value, exact / alpha tends to the
    estimate (grouped-query model: keys and values per key/value head)."""
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    site = resid.Site(1, "attn", field=kind, **({"kv_head": 1} if kind in ("k", "v") else {"head": 1}))
    clean, corrupt = model.run(CLEAN, capture=ALL).stream, model.run(CORRUPT, capture=ALL).stream
    read = (lambda s: s.layers[1].attn.pattern[:, 1]) if kind == "pattern" else (
        lambda s: getattr(s.layers[1].attn, kind)[:, :, 1])
    delta = read(clean) - read(corrupt)
    estimate = _estimate(model, site.label, kind, "atp")
    _assert_linear_limit(model, lambda alpha: [resid.Add(site, alpha * delta)], estimate)


@pytest.mark.parametrize("kind", ["q", "k"])
def test_atp_star_takes_queries_and_keys_through_the_exact_new_pattern(kind, gpt2_tokenizer):
    """AtP*'s estimate for a query (key) head is the linear limit of moving the pattern towards the one the clean
    queries (keys) give with the corrupt keys (queries), that pattern computed here by hand: causal softmax."""
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    layer, head, group = 1, 1, model.config.n_heads // model.config.n_kv_heads
    clean, corrupt = model.run(CLEAN, capture=ALL).stream, model.run(CORRUPT, capture=ALL).stream
    q = (clean if kind == "q" else corrupt).layers[layer].attn.q
    k = (clean if kind == "k" else corrupt).layers[layer].attn.k.repeat_interleave(group, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", q, k) * model.blocks[layer].attn.scale
    scores = scores.masked_fill(torch.ones(14, 14, dtype=torch.bool).triu(1), float("-inf"))
    moved = torch.softmax(scores, -1) - corrupt.layers[layer].attn.pattern  # [batch head pos key]
    heads = [head] if kind == "q" else [head * group + j for j in range(group)]
    unit = "kv_head" if kind == "k" else "head"
    estimate = _estimate(model, f"layers[{layer}].attn.{unit}[{head}].{kind}", kind, "atp*")
    _assert_linear_limit(model, lambda alpha: [
        resid.Add(resid.Site(layer, "attn", head=h, field="pattern"), alpha * moved[:, h]) for h in heads
    ], estimate)


def test_graddrop_equals_detaching_each_layer_in_turn(random_model):
    """AtP*'s magnitude: for each layer l, AtP with the layer's writes cut from the backward pass (here: detached;
    the layer's own sites get no gradient), summed in absolute value over l and divided by L - 1."""
    df = patching.atp(random_model, CLEAN, CORRUPT, TARGETS, BASELINES, sites=("sublayer", "head"),
                              method="atp*").set_index(["prompt_idx", "site"])
    n_layers, n_heads = random_model.config.n_layers, random_model.config.n_heads
    capture = resid.Capture(attn={"z", "out"}, mlp={"out"})
    clean, metric = random_model.run(CLEAN, capture=capture).stream, _metric(random_model)
    total: dict[str, torch.Tensor] = {}
    for dropped in range(n_layers):
        cut = [resid.Hook(resid.Site(dropped, part), lambda x, tokens: x.detach()) for part in ("attn", "mlp")]
        run = random_model.run(CORRUPT, capture=capture, interventions=cut, logits_at="last", grad=True)
        named = {}
        for l, (ours, theirs) in enumerate(zip(run.stream.layers, clean.layers)):
            for part in ("attn", "mlp"):
                named[f"layers[{l}].{part}"] = (getattr(ours, part).out, getattr(theirs, part).out)
            for h in range(n_heads):
                named[f"layers[{l}].attn.head[{h}]"] = (ours.attn.z, theirs.attn.z, h)
        live = {name: value for name, value in named.items() if value[0].requires_grad}
        tensors = list({id(v[0]): v[0] for v in live.values()}.values())
        grads = dict(zip(map(id, tensors), torch.autograd.grad(metric(run.logits[:, 0]).sum(), tensors,
                                                                  allow_unused=True)))
        for name, value in named.items():
            grad = grads.get(id(value[0]))
            if grad is None or name.startswith(f"layers[{dropped}]."):  # the dropped layer's own sites get none
                effect = torch.zeros(len(NAMES))
            elif len(value) == 3:
                h = value[2]
                effect = ((value[1][:, :, h] - value[0][:, :, h].detach()) * grad[:, :, h]).sum((1, 2))
            else:
                effect = ((value[1] - value[0].detach()) * grad).sum((1, 2))
            total[name] = total.get(name, 0) + effect.abs()
    for name, size in total.items():
        got = torch.tensor([df.loc[(i, name), "magnitude"] for i in range(len(NAMES))])
        assert torch.allclose(got, size.detach().double() / (n_layers - 1), atol=1e-5), name


def test_atp_star_on_smollm2_ioi_heads(smollm2):
    exact = patching.activation(smollm2, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head")
    star = patching.atp(smollm2, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head", method="atp*")
    scored = patching.compare(star, exact, k=20)
    assert scored["ranked_by"] == "magnitude" and scored["top_k_overlap"] >= 0.75 and scored["spearman"] > 0.5
    assert (star["magnitude"] >= 0).all()


def test_bad_input(gpt2_tokenizer):
    model = make_random_model("gpt2_like", gpt2_tokenizer)
    with pytest.raises(BAD_OPTION, match=r"(?s)method.*'atp', 'atp\*'"):
        patching.atp(model, CLEAN, CORRUPT, TARGETS, BASELINES, method="atp+")
    with pytest.raises(ResidError, match="unknown field 'logit_scores'"):  # ('scores' is a field: the softmax's input)
        resid.Site(0, "attn", head=0, field="logit_scores")
    with pytest.raises(ResidError, match="Attention patterns have no mean"):
        from resid.analyses import ablation
        ablation.sweep(model, CLEAN, TARGETS, sites=[resid.Site(0, "attn", head=0, field="pattern")],
                       method="mean", reference=CLEAN)
    estimate = patching.atp(model, CLEAN, CORRUPT, TARGETS, BASELINES, sites="head")
    with pytest.raises(ResidError, match="by must be"):
        patching.compare(estimate, estimate, by="size")
