"""Edge circuits (resid.analyses.circuits): the patched forward reproduces the clean model with every edge and the
corrupt one with none; exact edge patching equals patching by hand with plain transformers hooks; EAP is the
derivative of the patched metric; pruning keeps only paths from the embeddings to the logits; MIB's CPR and CMD."""

import numpy as np
import pandas as pd
import pytest
import torch
from random_models import make_random_model

from resid.analyses import circuits
from resid.analyses.circuits.graph import EMBED, LOGITS, EdgeGraph
from resid.analyses.circuits.patched import Writes, patched_logits
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


@pytest.mark.parametrize("kind", FAMILIES)
def test_every_edge_is_the_clean_model_and_none_the_corrupt_one(kind):
    model = make_random_model(kind)
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs()
    tokens = Tokens.from_ids(clean)
    reference = Writes.of(model, Tokens.from_ids(corrupt))
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
def test_models_whose_writes_are_normed_together_are_refused(kind):
    with pytest.raises(ResidError, match="post-norms"):
        EdgeGraph.of(make_random_model(kind).config)


def test_latent_attention_is_refused():
    from moe_models import make_deepseek_model

    with pytest.raises(ResidError, match="latent attention"):
        EdgeGraph.of(make_deepseek_model().config)


def test_mixture_of_experts_reproduces_both_runs():
    from moe_models import make_moe_model

    model = make_moe_model()
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs()
    reference = Writes.of(model, Tokens.from_ids(corrupt))
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
    writes = Writes.of(model, Tokens.from_ids(corrupt))
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


def test_exact_equals_patching_each_edge_alone():
    model = make_random_model("llama_gqa")
    graph = EdgeGraph.of(model.config)
    clean, corrupt = pairs(seed=2)
    edges = [(EMBED, Site(0, "attn", head=0, field="q")), (Site(0, "mlp"), Site(2, "attn", kv_head=0, field="k"))]
    df = circuits.exact(model, clean, corrupt, [1, 2, 3], [4, 5, 6], edges=edges)
    assert df["score"].notna().sum() == 2
    reference = Writes.of(model, Tokens.from_ids(corrupt))
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
    """metric(clean run with one edge patched) - metric(clean run), patched by hand in a transformers Llama: the
    writer's corrupt - clean output added to what the reader's projection (or norm) reads."""
    base, cfg = hf.model, hf.config
    d_head = cfg.hidden_size // cfg.num_attention_heads

    def writes(ids):
        found, hooks = {}, [base.embed_tokens.register_forward_hook(lambda m, i, o: found.__setitem__(EMBED, o))]
        for layer, block in enumerate(base.layers):
            hooks.append(block.self_attn.o_proj.register_forward_pre_hook(
                lambda m, i, layer=layer: found.__setitem__(("z", layer), i[0])))
            hooks.append(block.mlp.register_forward_hook(
                lambda m, i, o, layer=layer: found.__setitem__(Site(layer, "mlp"), o)))
        with torch.no_grad():
            logits = hf(ids).logits[:, -1]
        for hook in hooks:
            hook.remove()
        return found, logits

    def write(found, site):
        if site == EMBED or site.part == "mlp":
            return found[site]
        o_proj = base.layers[site.layer].self_attn.o_proj.weight
        cols = slice(site.head * d_head, (site.head + 1) * d_head)
        return found[("z", site.layer)][..., cols] @ o_proj[:, cols].T

    clean_found, clean_logits = writes(clean)
    corrupt_found, _ = writes(corrupt)
    delta = write(corrupt_found, writer) - write(clean_found, writer)
    hooks = []
    if reader == LOGITS:
        norm = base.norm
        hooks.append(norm.register_forward_hook(lambda m, i, o: m.forward(i[0] + delta)))
    elif reader.part == "mlp":
        norm = base.layers[reader.layer].post_attention_layernorm
        hooks.append(norm.register_forward_hook(lambda m, i, o: m.forward(i[0] + delta)))
    else:
        block = base.layers[reader.layer]
        seen = {}
        hooks.append(block.register_forward_pre_hook(
            lambda m, a, k: seen.__setitem__("resid", k["hidden_states"] if "hidden_states" in k else a[0]),
            with_kwargs=True))
        unit = reader.head if reader.field == "q" else reader.kv_head
        cols = slice(unit * d_head, (unit + 1) * d_head)
        projection = getattr(block.self_attn, f"{reader.field}_proj")

        def put(m, i, o):
            o = o.clone()
            o[..., cols] = m.forward(block.input_layernorm(seen["resid"] + delta))[..., cols]
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


def test_no_host_sync_grows_with_layers_or_circuits():
    """The patched pass and EAP's batch ask the host for nothing per layer, per circuit or per reader."""
    from host_syncs import HostSyncs

    from resid.analyses.circuits.eap import gradient_scores

    counts = []
    for n_layers, n_circuits in ((2, 1), (4, 3)):
        model = make_random_model("llama_gqa", n_layers=n_layers)
        graph = EdgeGraph.of(model.config)
        clean, corrupt = (Tokens.from_ids(ids) for ids in pairs(seed=7))
        reference = Writes.of(model, corrupt)
        keep = graph.full().float().expand(n_circuits, -1, -1).clone()
        t, b = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
        with HostSyncs() as syncs:
            patched_logits(model, graph, clean, reference, keep)
            gradient_scores(model, graph, clean, corrupt, t, b, "logit_diff", (0.5, 1.0), "inputs")
        counts.append(syncs)
    few, many = counts
    assert many.count == few.count, f"few: {few.count} ({few.where()})\nmany: {many.count} ({many.where()})"


@pytest.mark.parametrize("kind", FAMILIES)
def test_taps_give_the_gradients_of_a_probe_on_every_reader(kind):
    """Where nothing is patched, the gradients pushed back from the taps (q_proj, k_proj, v, the MLP's normalized
    input, the final residual) through the projections and the pre-norms equal a zero probe's on every input."""
    from resid.analyses.circuits.inputs import measure
    from resid.analyses.circuits.patched import EdgePass

    model = make_random_model(kind)
    graph = EdgeGraph.of(model.config)
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
        gradients.append(edge_pass.input_gradients(value) if taps else torch.autograd.grad(value, probe)[0])
    tapped, probed = gradients
    scale = float(probed.abs().max())
    assert scale > 0
    assert float((tapped - probed).abs().max()) <= 1e-5 * scale


@pytest.mark.parametrize("kind", ["llama_gqa", "neox_parallel"])
@pytest.mark.parametrize("reference", ["corrupt", "mean"])
def test_small_circuits_from_the_reference_equal_the_patched_form(kind, reference):
    """A pass of small circuits adds the kept terms to the reference's reads; with full circuits beside them the
    same pass swaps the patched terms into its own residual: both give the same logits."""
    model = make_random_model(kind)
    graph = EdgeGraph.of(model.config)
    clean, corrupt = (Tokens.from_ids(ids) for ids in pairs(seed=5))
    writes = Writes.of(model, corrupt)
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
