"""Path patching (resid.analyses.patching.path) against a brute-force implementation written independently here on
the transformers model of a tiny random Llama, with module hooks: freeze every head's z (the input of o_proj) at
the clean run's but the senders' (from the corrupt run), read the logits, or record the receivers' q/k/v
projections and run the clean prompt again with only those replaced."""

import pytest
import torch
from tiny_models import build

import resid
from resid.analyses import patching
from resid.errors import ResidError

CLEAN = ["The quick brown fox jumps over the lazy dog", "A small red bird sat on the old green fence"]
CORRUPT = ["The quick brown cat jumps over the lazy dog", "A small red bird sat on the new green fence"]
TARGET, BASELINE = 11, 42


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("path_llama")
    hf = build("llama", folder)
    return hf, resid.load(folder)


def _sender(layer: int, unit: int | str) -> resid.Site:
    return resid.Site(layer, "attn", head=unit) if isinstance(unit, int) else resid.Site(layer, unit)


def _receiver(layer: int, head: int, kind: str) -> resid.Site:
    unit = {"kv_head": head} if kind in ("k", "v") else {"head": head}
    return resid.Site(layer, "attn", field=kind, **unit)


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, TARGET] - logits[:, -1, BASELINE]


def _brute_force(hf, clean, corrupt, senders, receivers, d_head):
    """clean, corrupt: resid.Tokens (left-padded the same way), fed with their masks and position ids. A sender
    is (layer, head), (layer, "attn") for all its heads, or (layer, "mlp") for its output."""
    layers = hf.model.layers
    n_heads = hf.config.num_attention_heads
    heads = {(l, h) for l, u in senders for h in ([u] if isinstance(u, int) else range(n_heads) if u == "attn" else [])}
    z, mlp_out = {}, {}

    def run(tokens):
        return hf(input_ids=tokens.ids, attention_mask=tokens.attention_mask.long(), position_ids=tokens.position_ids)

    def record(which):
        return [layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, args, i=i: z.__setitem__((which, i), args[0].detach().clone())) for i, layer in enumerate(layers)]

    for which, tokens in (("clean", clean), ("corrupt", corrupt)):
        handles = record(which)
        handles += [layer.mlp.register_forward_hook(lambda m, a, out, i=i, w=which: mlp_out.__setitem__((w, i), out))
                    for i, layer in enumerate(layers)]
        with torch.no_grad():
            run(tokens)
        for h in handles:
            h.remove()

    def frozen(i):
        def hook(module, args):
            value = z[("clean", i)].clone()
            for layer, head in heads:
                if layer == i:
                    span = slice(head * d_head, (head + 1) * d_head)
                    value[..., span] = z[("corrupt", i)][..., span]
            return (value,)
        return hook

    handles = [layer.self_attn.o_proj.register_forward_pre_hook(frozen(i)) for i, layer in enumerate(layers)]
    handles += [layers[l].mlp.register_forward_hook(lambda m, a, out, l=l: mlp_out[("corrupt", l)])
                for l, u in senders if u == "mlp"]
    seen = {}
    for layer, head, kind in receivers:
        proj = getattr(layers[layer].self_attn, f"{kind}_proj")
        def keep(module, args, out, key=(layer, kind)):
            seen[key] = out.clone()

        handles.append(proj.register_forward_hook(keep))
    with torch.no_grad():
        logits = run(clean).logits
    for h in handles:
        h.remove()
    if not receivers:
        return _metric(logits)
    handles = []
    for layer, head, kind in receivers:
        def patch(module, args, out, layer=layer, head=head, kind=kind):
            out = out.clone()
            span = slice(head * d_head, (head + 1) * d_head)
            out[..., span] = seen[(layer, kind)][..., span]
            return out
        handles.append(getattr(layers[layer].self_attn, f"{kind}_proj").register_forward_hook(patch))
    with torch.no_grad():
        logits = run(clean).logits
    for h in handles:
        h.remove()
    return _metric(logits)


@pytest.mark.parametrize("receivers", ["logits", [(1, 2, "q")], [(1, 0, "k"), (1, 3, "v")]])
def test_path_patching_equals_the_brute_force(llama, receivers):
    hf, model = llama
    clean, corrupt = model.to_tokens(CLEAN), model.to_tokens(CORRUPT)
    senders = [[(0, 1)], [(0, 2), (0, 3)], [(0, 0), (1, 1)], [(0, "mlp")], [(0, "attn"), (1, 2)]]
    sites = "logits" if receivers == "logits" else [_receiver(*r) for r in receivers]
    df = patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=[[_sender(*s) for s in g] for g in senders],
                       receivers=sites, direction="noise")
    for group in senders:
        expected = _brute_force(hf, clean, corrupt, group, [] if receivers == "logits" else receivers,
                                model.config.d_head)
        label = " + ".join(_sender(*s).label for s in group)
        got = df[df.senders == label].sort_values("prompt_idx")["patched_metric"].to_numpy()
        assert got == pytest.approx(expected.double().numpy(), abs=1e-4)


def test_pattern_receivers_equal_their_queries_and_keys(llama):
    """A head's pattern is a function of its queries and its key/value head's keys: receiving the patterns of
    the heads that read key/value head 0 is receiving their queries and that head's keys."""
    _, model = llama
    senders = [_sender(0, 1), _sender(0, "mlp")]
    group = range(model.config.n_heads // model.config.n_kv_heads)
    patterns = patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=senders,
                             receivers=[_receiver(1, h, "pattern") for h in group], direction="noise")
    inputs = patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=senders,
                           receivers=[_receiver(1, h, "q") for h in group] + [_receiver(1, 0, "k")], direction="noise")
    assert patterns["patched_metric"].to_numpy() == pytest.approx(inputs["patched_metric"].to_numpy(), abs=1e-5)
    assert (patterns["patched_metric"] - patterns["clean_metric"]).abs().max() > 1e-4  # the senders do matter


def test_no_path_and_every_path(llama):
    """Senders whose z is the same in both runs change nothing; patching every head to the logits is exactly
    patching every head (MLPs recompute)."""
    _, model = llama
    same = patching.path(model, CLEAN, CLEAN, TARGET, BASELINE, senders=[_sender(1, 0)], direction="noise")
    assert (same["patched_metric"] - same["clean_metric"]).abs().max() < 1e-5
    assert (same["metric"] == "logit_diff").all() and (same["direction"] == "noise").all()
    every = [(l, h) for l in range(model.config.n_layers) for h in range(model.config.n_heads)]
    df = patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=[[_sender(l, h) for l, h in every]],
                       direction="noise")
    corrupt_z = model.run(CORRUPT, capture=resid.Capture(attn={"z"})).stream
    replaced = [resid.Replace(resid.Site(l, "attn", head=h), corrupt_z.layers[l].attn.z[..., h, :]) for l, h in every]
    expected = _metric(model.run(CLEAN, interventions=replaced).logits)
    assert df["patched_metric"].to_numpy() == pytest.approx(expected.double().numpy(), abs=1e-5)


def test_bad_input(llama):
    _, model = llama
    with pytest.raises(ResidError, match="needs senders"):
        patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=[])
    with pytest.raises(ResidError, match="out of range"):
        patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=[_sender(5, 0)])
    with pytest.raises(ResidError, match="A sender is"):
        patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=["layers[0].mlp.neuron[3]"])
    with pytest.raises(ResidError, match="A receiver is a head's input"):
        patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=[_sender(0, 0)],
                      receivers=["layers[1].attn.head[0]"])
    labels = patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=["layers[0].attn.head[1]"],
                           receivers=["layers[1].attn.head[2].q"])
    sites = patching.path(model, CLEAN, CORRUPT, TARGET, BASELINE, senders=[_sender(0, 1)],
                          receivers=[_receiver(1, 2, "q")])
    assert labels.equals(sites)  # labels work where Sites do
