"""Edge circuits (resid.analyses.circuits): the patched forward reproduces the clean model with every edge and the
corrupt one with none; exact edge patching equals patching by hand with plain transformers hooks; EAP is the
derivative of the patched metric; pruning keeps only paths from the embeddings to the logits; MIB's CPR and CMD."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from random_models import make_random_model

from resid.analyses import circuits
from resid.analyses.circuits.graph import EMBED, LOGITS, EdgeGraph
from resid.analyses.circuits.patched import patched_logits, plain_writes
from resid.capture import Capture
from resid.errors import ResidError
from resid.sites import Site
from resid.tokenizer import Tokens

FAMILIES = ["llama_gqa", "gpt2_like", "neox_parallel"]


def pairs(seed: int = 0, n: int = 3, n_pos: int = 6, vocab: int = 97) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, vocab, (n, n_pos), generator=g)
    corrupt = clean.clone()
    corrupt[:, 1] = torch.randint(0, vocab, (n,), generator=g)  # one token swapped, as IOI swaps a name
    corrupt[:, -2] = torch.randint(0, vocab, (n,), generator=g)
    return clean, corrupt


def last_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model.run(ids, capture=Capture.none(), logits_at="last").logits[:, 0]


FAMILIES_MORE = ["gemma3_like", "olmo2_like", "deepseek", "deepseek_q"]  # post-norms; latent attention


def model_of(kind: str):
    """A random model of `kind`: random_models' kinds, DeepSeek-like latent attention with a query latent
    ("deepseek") or per-head query projections ("deepseek_q"), or a mixture of experts with post-norms."""
    if kind == "moe_post_norms":  # experts and sandwich norms: the attention one writer, the MoE one node
        from moe_models import make_moe_model

        return make_moe_model(post_norms=True)
    if not kind.startswith("deepseek"):
        return make_random_model(kind)
    from moe_models import make_deepseek_model
    from random_models import randomize

    import resid

    model = make_deepseek_model()
    if kind == "deepseek_q":
        config = dataclasses.replace(model.config, q_rank=0)
        model = randomize(resid.Transformer(config, name="random-deepseek-q"), 0)
    return model


@pytest.mark.parametrize("kind", [*FAMILIES, *FAMILIES_MORE, "moe_post_norms"])
def test_every_edge_is_the_clean_model_and_none_the_corrupt_one(kind):
    model = model_of(kind)
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs()
    tokens = Tokens.from_ids(clean)
    reference = plain_writes(model, Tokens.from_ids(corrupt))
    logits = patched_logits(model, graph, tokens, reference, torch.stack([graph.full(), graph.empty()]).float())
    torch.testing.assert_close(logits[0], last_logits(model, clean), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], last_logits(model, corrupt), atol=1e-4, rtol=1e-4)


def test_graph_shares_key_value_heads_under_gqa():
    graph = EdgeGraph.of(make_random_model("llama_gqa").config)  # 4 query heads, 2 key/value heads
    layer0 = graph.layer_readers(0)
    assert [s.label for s in layer0 if s.field == "k"] == ["layers[0].attn.kv_head[0].k", "layers[0].attn.kv_head[1].k"]
    assert len(layer0) == 4 + 2 + 2 + 1
    assert graph.readers[-1] == LOGITS and graph.writers[0] == EMBED
    # a sequential block's MLP reads its own layer's heads; the next layer's heads read the MLP
    w, r = graph.edge_index(Site(0, "attn", head=3), Site(0, "mlp"))
    assert bool(graph.valid[w, r])
    with pytest.raises(ResidError, match="not an edge"):
        graph.edge_index(Site(1, "mlp"), Site(1, "attn", head=0, field="q"))


def test_parallel_block_mlp_does_not_read_its_own_heads():
    graph = EdgeGraph.of(make_random_model("neox_parallel").config)
    with pytest.raises(ResidError, match="not an edge"):
        graph.edge_index(Site(0, "attn", head=0), Site(0, "mlp"))


@pytest.mark.parametrize("kind", ["gemma3_like", "olmo2_like"])
def test_post_norms_make_each_attention_one_writer(kind):
    graph = EdgeGraph.of(make_random_model(kind).config)  # 3 layers, 4 query heads
    assert [s.label for s in graph.writers[:3]] == ["embed", "layers[0].attn", "layers[0].mlp"]
    assert len(graph.writers) == 1 + 3 * 2
    assert sum(1 for s in graph.layer_readers(0) if s.field == "q") == 4  # heads still read apart
    w, r = graph.edge_index(Site(0, "attn"), Site(0, "mlp"))
    assert bool(graph.valid[w, r])
    with pytest.raises(ResidError, match="post-norms"):
        graph.node_mask([Site(0, "attn", head=1)])
    mask = graph.node_mask([Site(1, "attn")])
    assert int(mask.sum()) == int(graph.valid[graph.writers.index(Site(1, "attn"))].sum()) + int(graph.valid[0].sum())


@pytest.mark.parametrize("kind", ["deepseek", "deepseek_q"])
def test_latent_attention_has_one_key_value_reader_per_layer(kind):
    graph = EdgeGraph.of(model_of(kind).config)  # 3 layers, 4 heads
    labels = [s.label for s in graph.layer_readers(1)]
    q = ["layers[1].attn.q"] if kind == "deepseek" else [f"layers[1].attn.head[{h}].q" for h in range(4)]
    assert labels == [*q, "layers[1].attn.kv_latent", "layers[1].mlp"]
    assert graph.writers[1:5] == tuple(Site(0, "attn", head=h) for h in range(4))  # o_proj is per head
    assert graph.fed(Site(1, "attn", field="kv_latent")) == graph.writer_slice(1, "attn")
    with pytest.raises(ResidError, match="kv_latent"):
        graph.edge_index(EMBED, Site(1, "attn", kv_head=0, field="k"))


def test_what_is_not_a_sum_of_writes_is_refused():
    config = make_random_model("gpt2_like").config
    with pytest.raises(ResidError, match="post-LN"):
        EdgeGraph.of(dataclasses.replace(config, post_ln=True, pre_norms=False))
    with pytest.raises(ResidError, match="no logits"):
        EdgeGraph.of(dataclasses.replace(config, head="none"))
    with pytest.raises(ResidError, match="cross-attention"):
        EdgeGraph.of(dataclasses.replace(config, cross_attention=True))


def test_mixture_of_experts_reproduces_both_runs():
    from moe_models import make_moe_model

    model = make_moe_model()
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs()
    reference = plain_writes(model, Tokens.from_ids(corrupt))
    logits = patched_logits(model, graph, Tokens.from_ids(clean), reference,
                            torch.stack([graph.full(), graph.empty()]).float())
    torch.testing.assert_close(logits[0], last_logits(model, clean), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], last_logits(model, corrupt), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["llama_gqa", "gpt2_like"])
def test_eap_is_the_derivative_of_the_patched_metric(kind):
    """EAP(w, r) = d/de metric(edge (w, r) weighted 1 - e) at e = 0, by central differences (e = 0.01: the
    norms and softmax run in float32 even in a float64 model, so a smaller step drowns in their rounding)."""
    model = make_random_model(kind).double()
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs(seed=1)
    targets, baselines = [5, 7, 11], [13, 17, 19]
    scores = circuits.eap(model, clean, corrupt, targets, baselines)
    s = circuits.matrix(graph, scores)
    writes = plain_writes(model, Tokens.from_ids(corrupt))
    eps = 1e-2
    picked = [(EMBED, Site(1, "attn", head=1, field="q")), (Site(0, "attn", head=2), Site(2, "attn", kv_head=1,
              field="v" if kind == "llama_gqa" else "k")), (Site(1, "mlp"), LOGITS), (Site(2, "attn", head=0),
              Site(2, "mlp"))]
    t, b = torch.tensor(targets), torch.tensor(baselines)
    for writer, reader in picked:
        w, r = graph.edge_index(writer, reader)
        keep = graph.full().double().expand(2, -1, -1).clone()
        keep[0, w, r], keep[1, w, r] = 1 - eps, 1 + eps
        logits = patched_logits(model, graph, Tokens.from_ids(clean), writes, keep)
        diff = logits[:, torch.arange(3), t] - logits[:, torch.arange(3), b]
        derivative = ((diff[0] - diff[1]) / (2 * eps)).mean()
        assert float(s[w, r]) == pytest.approx(float(derivative), rel=3e-3, abs=2e-5), (writer.label, reader.label)


@pytest.mark.parametrize("kind", FAMILIES_MORE)
def test_eap_is_the_derivative_of_the_patched_metric_on_post_norms_and_latents(kind):
    """As above on the graphs whose attention is one writer (post-norms) or whose keys and values (and queries)
    are read through a latent: an edge into each kind of reader, from each kind of writer (a query of layer 1: the
    last layer's queries matter only at the last position, where the pairs agree)."""
    model = model_of(kind).double()
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs(seed=1)
    targets, baselines = [5, 7, 11], [13, 17, 19]
    s = circuits.matrix(graph, circuits.eap(model, clean, corrupt, targets, baselines))
    writes = plain_writes(model, Tokens.from_ids(corrupt))
    eps = 1e-2
    attn0 = graph.writers[graph.writer_slice(0, "attn").stop - 1]
    attn1 = graph.writers[graph.writer_slice(1, "attn").start]
    picked = [(EMBED, graph.readers[graph.reader_slice(1, "q").start]), (Site(1, "mlp"), LOGITS),
              *((attn0, graph.readers[graph.reader_slice(2, field).stop - 1]) for field in graph.attn_fields[1:]),
              (attn1, Site(1, "mlp")), (attn1, LOGITS)]
    t, b = torch.tensor(targets), torch.tensor(baselines)
    keep = graph.full().double().expand(2 * len(picked), -1, -1).clone()
    for i, (writer, reader) in enumerate(picked):
        w, r = graph.edge_index(writer, reader)
        keep[2 * i, w, r], keep[2 * i + 1, w, r] = 1 - eps, 1 + eps
    logits = patched_logits(model, graph, Tokens.from_ids(clean), writes, keep)
    diff = (logits[:, torch.arange(3), t] - logits[:, torch.arange(3), b]).view(len(picked), 2, 3)
    for i, (writer, reader) in enumerate(picked):
        derivative = ((diff[i, 0] - diff[i, 1]) / (2 * eps)).mean()
        w, r = graph.edge_index(writer, reader)
        assert abs(float(derivative)) > 1e-4, (writer.label, reader.label)  # the edge matters: the check can fail
        assert float(s[w, r]) == pytest.approx(float(derivative), rel=3e-3, abs=2e-5), (writer.label, reader.label)


def test_exact_equals_patching_each_edge_alone():
    model = make_random_model("llama_gqa")
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs(seed=2)
    edges = [(EMBED, Site(0, "attn", head=0, field="q")), (Site(0, "mlp"), Site(2, "attn", kv_head=0, field="k"))]
    df = circuits.exact(model, clean, corrupt, [1, 2, 3], [4, 5, 6], edges=edges)
    assert df["score"].notna().sum() == 2
    reference = plain_writes(model, Tokens.from_ids(corrupt))
    base = last_logits(model, clean)
    rows = torch.arange(3)
    for writer, reader in edges:
        w, r = graph.edge_index(writer, reader)
        keep = graph.full().float()[None].clone()
        keep[0, w, r] = 0
        logits = patched_logits(model, graph, Tokens.from_ids(clean), reference, keep)[0]
        expected = ((logits[rows, [1, 2, 3]] - logits[rows, [4, 5, 6]])
                    - (base[rows, [1, 2, 3]] - base[rows, [4, 5, 6]]))
        got = df[(df["writer"] == writer.label) & (df["reader"] == reader.label)]["score"].item()
        assert got == pytest.approx(float(expected.mean()), abs=1e-5)


def test_eap_ig_on_activations_with_one_step_is_eap():
    model = make_random_model("llama_gqa")
    clean, corrupt = pairs(seed=3)
    a = circuits.eap(model, clean, corrupt, [1, 2, 3], [4, 5, 6])
    b = circuits.eap_ig(model, clean, corrupt, [1, 2, 3], [4, 5, 6], steps=1, on="activations")
    np.testing.assert_allclose(a["score"], b["score"], atol=1e-6)
    c = circuits.eap_ig(model, clean, corrupt, [1, 2, 3], [4, 5, 6], steps=3, on="inputs")
    assert c["method"].iloc[0] == "eap_ig_inputs" and np.isfinite(c["score"]).all()
    with pytest.raises(ResidError, match="steps"):
        circuits.eap_ig(model, clean, corrupt, [1, 2, 3], [4, 5, 6], steps=0)


def test_pruning_keeps_only_paths_from_the_embeddings_to_the_logits():
    graph = EdgeGraph.of(make_random_model("llama_gqa").config)
    mask = graph.empty()
    path = [(EMBED, Site(0, "attn", head=1, field="q")), (Site(0, "attn", head=1), Site(1, "mlp")),
            (Site(1, "mlp"), LOGITS)]
    dangling = [(EMBED, Site(2, "mlp")),  # MLP 2 writes nowhere kept
                (Site(1, "attn", head=0), LOGITS)]  # head 1.0 reads nothing kept
    for writer, reader in path + dangling:
        mask[graph.edge_index(writer, reader)] = True
    kept = circuits.pruned(graph, mask)
    assert int(kept.sum()) == len(path)
    assert all(bool(kept[graph.edge_index(w, r)]) for w, r in path)
    # a key/value head's input feeds each query head of its group
    mask = graph.empty()
    for writer, reader in [(EMBED, Site(0, "attn", kv_head=0, field="v")), (Site(0, "attn", head=1), LOGITS)]:
        mask[graph.edge_index(writer, reader)] = True
    assert int(circuits.pruned(graph, mask).sum()) == 2


@pytest.mark.parametrize("kind", FAMILIES_MORE)
def test_curves_pruning_and_figures_on_post_norms_and_latents(kind):
    """The whole pipeline on the graphs with whole-attention writers or latent readers: pruning keeps a path
    through each kind of reader, the curve reaches the model at every edge, the figure draws every kept edge."""
    from resid.analyses.circuits.figure import circuit_figure

    model = model_of(kind)
    graph = EdgeGraph.of(model.config)
    mask = graph.empty()
    into = graph.readers[graph.reader_slice(1, graph.attn_fields[-1]).start]  # a k / v / latent reader of layer 1
    attn0 = graph.writers[graph.writer_slice(0, "attn").start]
    path = [(EMBED, graph.readers[graph.reader_slice(0, "q").start]), (attn0, into),
            (graph.writers[graph.fed(into).start], LOGITS)]
    for writer, reader in [*path, (EMBED, Site(2, "mlp"))]:  # the last one writes nowhere kept
        mask[graph.edge_index(writer, reader)] = True
    kept = circuits.pruned(graph, mask)
    assert int(kept.sum()) == len(path) and all(bool(kept[graph.edge_index(w, r)]) for w, r in path)
    clean, corrupt = pairs(seed=4)
    scores = circuits.eap(model, clean, corrupt, [1, 2, 3], [4, 5, 6])
    curve = circuits.faithfulness_curve(model, clean, corrupt, [1, 2, 3], scores, [4, 5, 6], fractions=(0.1, 1.0))
    assert curve["faithfulness"].iloc[-1] == pytest.approx(1.0, abs=1e-4)
    figure = circuit_figure(graph, kept, circuits.matrix(graph, scores))
    assert len(figure.data) == len(path) + 1  # one line per edge, one trace of nodes


def test_top_k_and_threshold():
    graph = EdgeGraph.of(make_random_model("gpt2_like").config)
    scores = torch.zeros(len(graph.writers), len(graph.readers))
    w, r = graph.edges
    scores[torch.as_tensor(w), torch.as_tensor(r)] = torch.linspace(-1, 1, graph.n_edges)
    mask = circuits.top_k(graph, scores, 5, prune=False)
    assert int(mask.sum()) == 5 and bool(mask[w[0], r[0]]) and bool(mask[w[-1], r[-1]])
    assert int(circuits.threshold(graph, scores, 0.999, prune=False).sum()) == 2
    with pytest.raises(ResidError, match="whole number of edges"):
        circuits.top_k(graph, scores, graph.n_edges + 1)


def test_faithfulness_curve_cpr_and_cmd():
    model = make_random_model("llama_gqa")
    clean, corrupt = pairs(seed=4)
    scores = circuits.eap(model, clean, corrupt, [1, 2, 3], [4, 5, 6])
    curve = circuits.faithfulness_curve(model, clean, corrupt, [1, 2, 3], scores, [4, 5, 6],
                                        fractions=(0.1, 0.5, 1.0))
    assert list(curve["fraction"]) == [0.1, 0.5, 1.0]
    assert curve["faithfulness"].iloc[-1] == pytest.approx(1.0, abs=1e-4)  # every edge: the model
    f = curve["faithfulness"].to_numpy()
    assert circuits.cpr(curve) == pytest.approx(0.4 * (f[0] + f[1]) / 2 + 0.5 * (f[1] + f[2]) / 2)
    assert circuits.cmd(curve) == pytest.approx(0.4 * (abs(1 - f[0]) + abs(1 - f[1])) / 2
                                                + 0.5 * (abs(1 - f[1]) + abs(1 - f[2])) / 2)
    synthetic = pd.DataFrame({"fraction": [0.0, 1.0], "faithfulness": [1.0, 1.0]})
    assert circuits.cpr(synthetic) == 1.0 and circuits.cmd(synthetic) == 0.0


def test_necessity_and_sufficiency_of_nodes():
    model = make_random_model("llama_gqa")
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs(seed=5)
    every = [site for site in graph.writers if site != EMBED]
    df = circuits.necessity_sufficiency(model, clean, corrupt, [1, 2, 3], every, [4, 5, 6])
    assert df["sufficiency"].item() == pytest.approx(1.0, abs=1e-4)  # every node: the model
    # the embeddings' edges alone: every other node patched
    none = circuits.necessity_sufficiency(model, clean, corrupt, [1, 2, 3], [], [4, 5, 6])
    assert int(none["edges"].item()) == int(graph.valid[0].sum())


def test_unequal_lengths_are_refused():
    model = make_random_model("llama_gqa")
    with pytest.raises(ResidError, match="same token length|equal token lengths"):
        circuits.eap(model, Tokens.pad([[1, 2, 3]], 0), Tokens.pad([[1, 2]], 0), [4], [5])


LLAMA_GQA = pytest.mark.parametrize("tiny", ["llama_gqa_tied"], indirect=True)


def _hf_edge_effect(hf, clean, corrupt, targets, baselines, writer: Site, reader: Site) -> float:
    """metric(clean run with one edge patched) - metric(clean run), patched by hand in a transformers decoder
    (Llama, Gemma 3, OLMo 2, DeepSeek V2/V3): the writer's corrupt - clean output added to what the reader's
    projection (or latent, or norm) reads. A head writes z[h] @ W_O[h]; under post-norms the attention writes its
    post-normed output as a whole; an MLP writes its (post-normed) output."""
    base, cfg = hf.model, hf.config
    post_ffn = lambda block: getattr(block, "post_feedforward_layernorm", None) or block.mlp  # noqa: E731
    post_norms = hasattr(base.layers[0], "post_feedforward_layernorm")

    def writes(ids):
        found, hooks = {}, [base.layers[0].register_forward_pre_hook(
            lambda m, a, k: found.__setitem__(EMBED, k["hidden_states"] if "hidden_states" in k else a[0]),
            with_kwargs=True)]
        for layer, block in enumerate(base.layers):
            if post_norms:
                hooks.append(block.post_attention_layernorm.register_forward_hook(
                    lambda m, i, o, layer=layer: found.__setitem__(Site(layer, "attn"), o)))
            hooks.append(block.self_attn.o_proj.register_forward_pre_hook(
                lambda m, i, layer=layer: found.__setitem__(("z", layer), i[0])))
            hooks.append(post_ffn(block).register_forward_hook(
                lambda m, i, o, layer=layer: found.__setitem__(Site(layer, "mlp"), o)))
        with torch.no_grad():
            logits = hf(ids).logits[:, -1]
        for hook in hooks:
            hook.remove()
        return found, logits

    def write(found, site):
        if site == EMBED or site.part == "mlp" or site.head is None:
            return found[site]
        o_proj = base.layers[site.layer].self_attn.o_proj.weight
        d_v = o_proj.shape[1] // cfg.num_attention_heads
        cols = slice(site.head * d_v, (site.head + 1) * d_v)
        return found[("z", site.layer)][..., cols] @ o_proj[:, cols].T

    clean_found, clean_logits = writes(clean)
    corrupt_found, _ = writes(corrupt)
    delta = write(corrupt_found, writer) - write(clean_found, writer)
    hooks = []
    if reader == LOGITS:
        hooks.append(base.norm.register_forward_hook(lambda m, i, o: m.forward(i[0] + delta)))
    elif reader.part == "mlp":
        block = base.layers[reader.layer]
        norm = getattr(block, "pre_feedforward_layernorm", None) or (
            None if post_norms else block.post_attention_layernorm)  # OLMo 2: the MLP reads resid_mid itself
        if norm is None:
            hooks.append(block.mlp.register_forward_pre_hook(lambda m, i: (i[0] + delta,)))
        else:
            hooks.append(norm.register_forward_hook(lambda m, i, o: m.forward(i[0] + delta)))
    else:
        block = base.layers[reader.layer]
        pre = getattr(block, "input_layernorm", None) or (lambda x: x)  # OLMo 2: no pre-norm
        seen = {}
        hooks.append(block.register_forward_pre_hook(
            lambda m, a, k: seen.__setitem__("resid", k["hidden_states"] if "hidden_states" in k else a[0]),
            with_kwargs=True))
        attn = block.self_attn
        if reader.field in ("kv_latent", "q") and reader.head is None:  # a latent reads every head's input
            projection, cols = attn.kv_a_proj_with_mqa if reader.field == "kv_latent" else attn.q_a_proj, slice(None)
        else:
            unit = reader.head if reader.field == "q" else reader.kv_head
            projection = getattr(attn, f"{reader.field}_proj")
            heads = cfg.num_attention_heads if reader.field == "q" else cfg.num_key_value_heads
            width = projection.weight.shape[0] // heads
            cols = slice(unit * width, (unit + 1) * width)

        def put(m, i, o):
            o = o.clone()
            o[..., cols] = m.forward(pre(seen["resid"] + delta))[..., cols]
            return o
        hooks.append(projection.register_forward_hook(put))
    with torch.no_grad():
        logits = hf(clean).logits[:, -1]
    for hook in hooks:
        hook.remove()
    rows = torch.arange(len(targets))
    metric = lambda x: x[rows, targets] - x[rows, baselines]  # noqa: E731
    return float((metric(logits) - metric(clean_logits)).mean())


@LLAMA_GQA
def test_exact_equals_patching_by_hand_with_transformers_hooks(tiny):
    g = torch.Generator().manual_seed(6)
    clean = torch.randint(0, 50257, (2, 7), generator=g)
    corrupt = clean.clone()
    corrupt[:, 2] = torch.randint(0, 50257, (2,), generator=g)
    targets, baselines = torch.tensor([11, 22]), torch.tensor([33, 44])
    edges = [(EMBED, Site(0, "attn", head=3, field="q")), (EMBED, Site(1, "attn", kv_head=1, field="k")),
             (Site(0, "attn", head=2), Site(1, "attn", kv_head=0, field="v")), (Site(0, "mlp"), Site(1, "mlp")),
             (Site(1, "attn", head=1), Site(1, "mlp")), (Site(1, "mlp"), LOGITS)]
    df = circuits.exact(tiny.model, clean, corrupt, targets.tolist(), baselines.tolist(), edges=edges)
    for writer, reader in edges:
        got = df[(df["writer"] == writer.label) & (df["reader"] == reader.label)]["score"].item()
        expected = _hf_edge_effect(tiny.hf, clean, corrupt, targets, baselines, writer, reader)
        assert abs(expected) > 1e-4, (writer.label, reader.label)  # the edge matters, so the check can fail
        assert got == pytest.approx(expected, abs=1e-4, rel=1e-4), (writer.label, reader.label)


@pytest.mark.parametrize("tiny", ["gemma3", "olmo2", "deepseek_v3", "deepseek_v2"], indirect=True)
def test_exact_equals_patching_by_hand_on_post_norms_and_latents(tiny):
    """Gemma 3 (sandwich norms) and OLMo 2 (post-norms only: its readers read the residual itself): a layer's
    attention is one writer, its post-normed output; DeepSeek V3 (a query latent) and V2 (per-head queries): one
    key/value reader per layer, the latent's input (its rotary key included)."""
    g = torch.Generator().manual_seed(6)
    clean = torch.randint(0, 50257, (2, 7), generator=g)
    corrupt = clean.clone()
    corrupt[:, 4] = torch.randint(0, 50257, (2,), generator=g)  # within Gemma 3's window of 4 of the last token
    targets, baselines = torch.tensor([11, 22]), torch.tensor([33, 44])
    graph = EdgeGraph.of(tiny.model.config)
    attn0, attn1 = (graph.writers[graph.writer_slice(layer, "attn").stop - 1] for layer in (0, 1))
    edges = [(EMBED, graph.readers[graph.reader_slice(0, "q").stop - 1]),
             *((attn0, graph.readers[graph.reader_slice(1, field).start]) for field in graph.attn_fields),
             (Site(0, "mlp"), Site(1, "mlp")), (attn1, Site(1, "mlp")), (Site(1, "mlp"), LOGITS), (attn1, LOGITS)]
    df = circuits.exact(tiny.model, clean, corrupt, targets.tolist(), baselines.tolist(), edges=edges)
    for writer, reader in edges:
        got = df[(df["writer"] == writer.label) & (df["reader"] == reader.label)]["score"].item()
        expected = _hf_edge_effect(tiny.hf, clean, corrupt, targets, baselines, writer, reader)
        assert abs(expected) > 1e-4, (writer.label, reader.label)  # the edge matters, so the check can fail
        assert got == pytest.approx(expected, abs=1e-4, rel=1e-3), (writer.label, reader.label)


@pytest.mark.parametrize("kind", ["llama_gqa", "olmo2_like", "deepseek"])
def test_no_host_sync_grows_with_layers_or_circuits(kind):
    """The patched pass and EAP's batch ask the host for nothing per layer, per circuit or per reader (post-norms
    without pre-norms, latent attention too)."""
    from host_syncs import HostSyncs
    from random_models import randomize

    import resid
    from resid.analyses.circuits.eap import gradient_scores

    def sized(n_layers: int):
        if kind != "deepseek":
            return make_random_model(kind, n_layers=n_layers)
        # every layer dense: the experts' routing asks the host per MoE layer (resid.components.moe), not the pass
        config = dataclasses.replace(model_of(kind).config, n_layers=n_layers, n_dense_layers=n_layers)
        return randomize(resid.Transformer(config, name="random-deepseek"), 0)

    counts = []
    for n_layers, n_circuits in ((2, 1), (4, 3)):
        model = sized(n_layers)
        graph = EdgeGraph.of(model.config)
        clean, corrupt = (Tokens.from_ids(ids) for ids in pairs(seed=7))
        reference = plain_writes(model, corrupt)
        keep = graph.full().float().expand(n_circuits, -1, -1).clone()
        t, b = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
        with HostSyncs() as syncs:
            patched_logits(model, graph, clean, reference, keep)
            gradient_scores(model, graph, clean, corrupt, t, b, "logit_diff", (0.5, 1.0), "inputs")
        counts.append(syncs)
    few, many = counts
    assert many.count == few.count, f"few: {few.count} ({few.where()})\nmany: {many.count} ({many.where()})"


@pytest.mark.parametrize("kind", [*FAMILIES, "gemma3_like"])
def test_taps_give_the_gradients_of_a_probe_on_every_reader(kind):
    """Where nothing is patched, the gradients pushed back from the taps (q_proj, k_proj, v, the MLP's normalized
    input, the final residual) through the projections and the pre-norms equal a zero probe's on every input
    (post-norms with pre-norms too: the attention writes as one, its readers are still pre-norm projections)."""
    from resid.analyses.circuits.inputs import measure
    from resid.analyses.circuits.patched import EdgePass
    from resid.analyses.circuits.taps import input_gradients, tappable

    model = model_of(kind)
    graph = EdgeGraph.of(model.config)
    assert tappable(model, graph)
    clean, _ = pairs(seed=4)
    tokens = Tokens.from_ids(clean)
    t, b = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    gradients = []
    for taps in (True, False):
        probe = None if taps else torch.zeros(*clean.shape, len(graph.readers), model.config.d_model,
                                              requires_grad=True)
        edge_pass = EdgePass(model, graph, None, None, probe, taps=taps)
        run = model.run(tokens, capture=Capture.none(), interventions=edge_pass.interventions(), logits_at="last",
                        grad=True)
        value = measure("logit_diff", run.logits[:, 0], t, b).sum()
        gradients.append(input_gradients(edge_pass, value) if taps else torch.autograd.grad(value, probe)[0])
    tapped, probed = gradients
    scale = float(probed.abs().max())
    assert scale > 0
    assert float((tapped - probed).abs().max()) <= 1e-5 * scale


@pytest.mark.parametrize("kind", ["olmo2_like", "deepseek", "deepseek_q"])
def test_readers_that_are_not_pre_norm_projections_take_the_probe(kind):
    """Without pre-norms or with latent attention taps are refused by name; EAP there runs on a probe (its
    derivative tests: test_eap_is_the_derivative_of_the_patched_metric_on_post_norms_and_latents)."""
    from resid.analyses.circuits.patched import EdgePass
    from resid.analyses.circuits.taps import tappable

    model = model_of(kind)
    graph = EdgeGraph.of(model.config)
    assert not tappable(model, graph)
    with pytest.raises(ResidError, match="probe"):
        EdgePass(model, graph, None, None, taps=True)


@pytest.mark.parametrize("kind", ["llama_gqa", "neox_parallel", *FAMILIES_MORE])
@pytest.mark.parametrize("reference", ["corrupt", "mean"])
def test_small_circuits_from_the_reference_equal_the_patched_form(kind, reference):
    """A pass of small circuits adds the kept terms to the reference's reads; with full circuits beside them the
    same pass swaps the patched terms into its own residual: both give the same logits (post-norms, no pre-norms
    and latent attention too)."""
    model = model_of(kind)
    graph = EdgeGraph.of(model.config)
    clean, corrupt = (Tokens.from_ids(ids) for ids in pairs(seed=5))
    writes = plain_writes(model, corrupt)
    if reference == "mean":
        writes = writes.mean(corrupt.attention_mask.float())
    g = torch.Generator().manual_seed(0)
    small = torch.stack([graph.valid & (torch.rand(graph.valid.shape, generator=g) < p) for p in (0.2, 0.4)])
    assert small.any((1, 2)).all()
    alone = patched_logits(model, graph, clean, writes, small.float())
    full = graph.full()[None].expand(6, -1, -1)
    beside = patched_logits(model, graph, clean, writes, torch.cat([small, full]).float())[:2]
    assert float((alone - beside).abs().max()) <= 1e-4 * float(beside.abs().max())
    assert float((alone[0] - alone[1]).abs().max()) > 1e-3  # the circuits differ


@pytest.mark.parametrize("kind", ["llama_gqa", "olmo2_like", "deepseek"])
@pytest.mark.parametrize("reference", ["corrupt", "mean"])
def test_circuit_values_equal_the_patched_runs_of_every_mask(kind, reference):
    """circuit_values runs each distinct mask once (small ones from the reference's reads) and takes the model and
    (corrupt reference) the empty circuit from the plain runs: its rows equal the patched pass of every mask."""
    from resid.analyses.circuits.evaluation import circuit_values
    from resid.analyses.circuits.inputs import measure

    model = model_of(kind)
    graph = EdgeGraph.of(model.config)
    clean, corrupt = (Tokens.from_ids(ids) for ids in pairs(seed=8))
    g = torch.Generator().manual_seed(2)
    some = graph.valid & (torch.rand(graph.valid.shape, generator=g) < 0.3)
    masks = [some, graph.full(), some]
    t, b = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    got = circuit_values(model, graph, clean, corrupt, t, b, "logit_diff", masks, reference)
    writes = plain_writes(model, corrupt)
    writes = writes.mean(corrupt.attention_mask) if reference == "mean" else writes
    every = torch.stack([*masks, graph.full(), graph.empty()]).float()
    logits = torch.cat([patched_logits(model, graph, clean, writes, keep[None]) for keep in every])  # one form each
    expected = measure("logit_diff", logits.flatten(0, 1), t.repeat(len(every)), b.repeat(len(every))).view(
        len(every), -1)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert float((expected[0] - expected[4]).abs().max()) > 1e-3  # the circuit matters
