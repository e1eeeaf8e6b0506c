"""Edge circuits of encoder-decoder models (resid.analyses.circuits.seq2seq) on tiny random T5s: every edge kept is
the clean run and none the corrupt one; exact edge patching equals patching by hand with transformers hooks, edges
inside the encoder, inside the decoder and across the cross-attention; circuits are evaluated; EAP is refused."""

import pytest
import torch
from t5_models import t5

import resid
from resid.analyses import circuits
from resid.analyses.circuits.graph import EMBED, LOGITS
from resid.analyses.circuits.seq2seq import Seq2SeqGraph, last_logits, logits_with, writes_of
from resid.errors import ResidError
from resid.sites import Site
from resid.tokenizer import Tokens

ENCODER_EMBED = Site(None, "embed", stack="encoder")


@pytest.fixture(scope="module", params=["1.0", "1.1"])
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"t5_{request.param}")
    hf = t5(folder, request.param, std=0.5)
    return hf, resid.load(folder)


def sides(seed: int = 0):
    """(clean, corrupt) as (source, target) ids: a source token and a target token swapped."""
    g = torch.Generator().manual_seed(seed)
    source = torch.randint(2, 70, (2, 7), generator=g)
    target = torch.randint(2, 70, (2, 5), generator=g)
    target[:, 0] = 0  # the decoder's start token
    corrupt_source, corrupt_target = source.clone(), target.clone()
    corrupt_source[:, 3] = torch.randint(2, 70, (2,), generator=g)
    corrupt_target[:, 2] = torch.randint(2, 70, (2,), generator=g)
    return (source, target), (corrupt_source, corrupt_target)


def test_every_edge_is_the_clean_model_and_none_the_corrupt_one(pair):
    _, model = pair
    graph = Seq2SeqGraph.of(model)
    (source, target), (corrupt_source, corrupt_target) = sides()
    clean = (Tokens.from_ids(source), Tokens.from_ids(target))
    corrupt = (Tokens.from_ids(corrupt_source), Tokens.from_ids(corrupt_target))
    logits = logits_with(model, graph, clean, writes_of(model, corrupt),
                         torch.stack([graph.full(), graph.empty()]).float())
    torch.testing.assert_close(logits[0], last_logits(model, clean), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], last_logits(model, corrupt), atol=1e-4, rtol=1e-4)


def test_graph_joins_the_stacks_by_cross_attention(pair):
    _, model = pair
    graph = Seq2SeqGraph.of(model)  # encoder 2 layers, decoder 3, 4 heads
    cross_k = Site(2, "cross", kv_head=1, field="k")
    assert bool(graph.valid[graph.edge_index(Site(1, "mlp", stack="encoder"), cross_k)])
    assert bool(graph.valid[graph.edge_index(ENCODER_EMBED, Site(0, "cross", kv_head=0, field="v"))])
    assert bool(graph.valid[graph.edge_index(Site(0, "attn", head=1), Site(0, "cross", head=2, field="q"))])
    assert bool(graph.valid[graph.edge_index(Site(0, "cross", head=3), Site(0, "mlp"))])
    with pytest.raises(ResidError, match="not an edge"):  # the decoder writes nothing the encoder reads
        graph.edge_index(EMBED, cross_k)
    with pytest.raises(ResidError, match="not an edge"):  # the encoder reaches the decoder only through k and v
        graph.edge_index(ENCODER_EMBED, Site(0, "cross", head=0, field="q"))


def _hf_edge_effect(hf, clean, corrupt, targets, baselines, writer: Site, reader: Site) -> float:
    """metric(clean run with one edge patched) - metric(clean run), patched by hand in a transformers T5: the
    writer's corrupt - clean output added to what the reader's projection (or norm) reads."""
    stacks = {"encoder": hf.encoder, None: hf.decoder}

    def resid_in(module, store, key):
        return module.register_forward_pre_hook(
            lambda m, a, k: store.__setitem__(key, k["hidden_states"] if "hidden_states" in k else a[0]),
            with_kwargs=True)

    def writes(ids):
        found, hooks = {}, []
        for stack, part in stacks.items():
            hooks.append(resid_in(part.block[0], found, Site(None, "embed", stack=stack)))
            for layer, block in enumerate(part.block):
                for index, sub in enumerate(block.layer):
                    name = "mlp" if index == len(block.layer) - 1 else ("attn" if index == 0 else "cross")
                    if name == "mlp":
                        hooks.append(sub.DenseReluDense.register_forward_hook(
                            lambda m, i, o, key=Site(layer, "mlp", stack=stack): found.__setitem__(key, o)))
                    else:
                        attention = sub.SelfAttention if name == "attn" else sub.EncDecAttention
                        hooks.append(attention.o.register_forward_pre_hook(
                            lambda m, i, key=(stack, name, layer): found.__setitem__(key, i[0])))
        with torch.no_grad():
            logits = hf(input_ids=ids[0], decoder_input_ids=ids[1], use_cache=False).logits[:, -1]
        for hook in hooks:
            hook.remove()
        return found, logits

    def attention(site):
        block = stacks[site.stack].block[site.layer]
        return block.layer[0].SelfAttention if site.part == "attn" else block.layer[1].EncDecAttention

    def write(found, site):
        if site.part in ("embed", "mlp"):
            return found[site]
        o = attention(site).o.weight
        width = o.shape[1] // hf.config.num_heads
        cols = slice(site.head * width, (site.head + 1) * width)
        return found[(site.stack, site.part, site.layer)][..., cols] @ o[:, cols].T

    clean_found, clean_logits = writes(clean)
    corrupt_found, _ = writes(corrupt)
    delta = write(corrupt_found, writer) - write(clean_found, writer)
    hooks, seen = [], {}
    plus = lambda m, i, o: m.forward(i[0] + delta)  # noqa: E731
    if reader == LOGITS:
        hooks.append(hf.decoder.final_layer_norm.register_forward_hook(plus))
    elif reader.part == "mlp":
        hooks.append(stacks[reader.stack].block[reader.layer].layer[-1].layer_norm.register_forward_hook(plus))
    else:
        block = stacks[reader.stack].block[reader.layer]
        sub = block.layer[0] if reader.part == "attn" else block.layer[1]
        across = reader.part == "cross" and reader.field in ("k", "v")  # reads the encoder's final output
        if across:
            norm = hf.encoder.final_layer_norm
            hooks.append(resid_in(norm, seen, "resid"))
        else:
            norm = sub.layer_norm
            hooks.append(resid_in(sub, seen, "resid"))
        unit = reader.head if reader.field == "q" else reader.kv_head
        projection = getattr(attention(reader), reader.field)
        width = projection.weight.shape[0] // hf.config.num_heads
        cols = slice(unit * width, (unit + 1) * width)

        def put(m, i, o):
            o = o.clone()
            o[..., cols] = m.forward(norm(seen["resid"] + delta))[..., cols]
            return o
        hooks.append(projection.register_forward_hook(put))
    with torch.no_grad():
        logits = hf(input_ids=clean[0], decoder_input_ids=clean[1], use_cache=False).logits[:, -1]
    for hook in hooks:
        hook.remove()
    rows = torch.arange(len(targets))
    metric = lambda x: x[rows, targets] - x[rows, baselines]  # noqa: E731
    return float((metric(logits) - metric(clean_logits)).mean())


def test_exact_equals_patching_by_hand_with_transformers_hooks(pair):
    hf, model = pair
    clean, corrupt = sides(seed=1)
    targets, baselines = torch.tensor([11, 22]), torch.tensor([33, 44])
    enc = lambda layer, part, **kw: Site(layer, part, stack="encoder", **kw)  # noqa: E731
    edges = [(ENCODER_EMBED, enc(1, "attn", head=2, field="q")),  # inside the encoder
             (enc(0, "attn", head=1), enc(1, "attn", kv_head=3, field="v")), (enc(0, "mlp"), enc(1, "mlp")),
             # across: into the cross-attention's keys and values
             (ENCODER_EMBED, Site(0, "cross", kv_head=1, field="k")), (enc(1, "mlp"), Site(2, "cross", kv_head=1,
                                                                                             field="k")),
             (enc(0, "attn", head=3), Site(1, "cross", kv_head=0, field="v")),
             (enc(1, "attn", head=0), Site(0, "cross", kv_head=2, field="v")),
             # inside the decoder
             (EMBED, Site(0, "attn", head=1, field="q")), (EMBED, Site(0, "cross", head=0, field="q")),
             (Site(0, "attn", head=2), Site(0, "cross", head=1, field="q")), (Site(1, "cross", head=3), Site(1, "mlp")),
             (Site(0, "cross", head=0), Site(1, "attn", kv_head=2, field="v")),
             (Site(0, "mlp"), Site(1, "cross", head=1, field="q")), (Site(2, "mlp"), LOGITS)]
    df = circuits.exact(model, clean[1], corrupt[1], targets.tolist(), baselines.tolist(), edges=edges,
                        source=clean[0], corrupt_source=corrupt[0])
    assert df["score"].notna().sum() == len(edges)
    for writer, reader in edges:
        got = df[(df["writer"] == writer.label) & (df["reader"] == reader.label)]["score"].item()
        expected = _hf_edge_effect(hf, clean, corrupt, targets, baselines, writer, reader)
        assert abs(expected) > 1e-4, (writer.label, reader.label)  # the edge matters, so the check can fail
        assert got == pytest.approx(expected, abs=1e-4, rel=1e-3), (writer.label, reader.label)


def test_circuits_are_evaluated_and_eap_refused(pair):
    _, model = pair
    graph = Seq2SeqGraph.of(model)
    clean, corrupt = sides(seed=2)
    given = dict(source=clean[0], corrupt_source=corrupt[0])
    decoder_nodes = [site for site in graph.writers if site.stack is None and site != EMBED]
    df = circuits.necessity_sufficiency(model, clean[1], corrupt[1], [11, 22], decoder_nodes, [33, 44], **given)
    assert df["edges"].item() == int(graph.node_mask(decoder_nodes).sum())
    every = circuits.evaluate(model, clean[1], corrupt[1], [11, 22], [graph.full(), graph.empty()], [33, 44], **given)
    assert every["faithfulness"].tolist() == pytest.approx([1.0, 0.0], abs=1e-4)
    with pytest.raises(ResidError, match="EAP is not built for encoder-decoder"):
        circuits.eap(model, clean[1], corrupt[1], [11, 22], [33, 44])
    with pytest.raises(ResidError, match="encoder-decoder model: pass source="):
        circuits.exact(model, clean[1], corrupt[1], [11, 22], [33, 44])


def test_no_host_sync_grows_with_layers_or_circuits(tmp_path):
    """The two-pass patched run asks the host for nothing per layer of either stack or per circuit."""
    from host_syncs import HostSyncs

    counts = []
    for layers, n_circuits in ((1, 1), (3, 3)):
        folder = tmp_path / f"t5_{layers}"
        t5(folder, "1.1", num_layers=layers, num_decoder_layers=layers)
        model = resid.load(folder)
        graph = Seq2SeqGraph.of(model)
        (source, target), (corrupt_source, corrupt_target) = sides()
        clean = (Tokens.from_ids(source), Tokens.from_ids(target))
        reference = writes_of(model, (Tokens.from_ids(corrupt_source), Tokens.from_ids(corrupt_target)))
        keep = graph.full().float().expand(n_circuits, -1, -1).clone()
        with HostSyncs() as syncs:
            logits_with(model, graph, clean, reference, keep)
        counts.append(syncs)
    few, many = counts
    assert many.count == few.count, f"few: {few.count} ({few.where()})\nmany: {many.count} ({many.where()})"


def test_pruning_follows_the_cross_attention_and_curves_run(pair):
    _, model = pair
    graph = Seq2SeqGraph.of(model)
    enc = lambda layer, part, **kw: Site(layer, part, stack="encoder", **kw)  # noqa: E731
    path = [(ENCODER_EMBED, enc(0, "attn", head=1, field="q")),  # encoder head 0.1 -> its keys of decoder layer 1
            (enc(0, "attn", head=1), Site(1, "cross", kv_head=2, field="k")),
            (Site(1, "cross", head=2), LOGITS)]  # -> the query head its key/value head serves -> the logits
    dangling = [(enc(0, "mlp"), enc(1, "mlp")),  # encoder MLP 1 writes nowhere kept
                (EMBED, Site(2, "mlp"))]  # and decoder MLP 2 writes nowhere kept
    mask = graph.empty()
    for writer, reader in path + dangling:
        mask[graph.edge_index(writer, reader)] = True
    kept = circuits.pruned(graph, mask)
    assert int(kept.sum()) == len(path) and all(bool(kept[graph.edge_index(w, r)]) for w, r in path)
    clean, corrupt = sides(seed=3)
    given = dict(source=clean[0], corrupt_source=corrupt[0])
    chosen = [(w, r) for w, r in zip(*graph.edges)][:: max(1, graph.n_edges // 40)]
    edges = [(graph.writers[w], graph.readers[r]) for w, r in chosen]
    scores = circuits.exact(model, clean[1], corrupt[1], [11, 22], [33, 44], edges=edges, **given).fillna(0.0)
    curve = circuits.faithfulness_curve(model, clean[1], corrupt[1], [11, 22], scores, [33, 44],
                                        fractions=(0.05, 1.0), **given)
    assert curve["faithfulness"].iloc[-1] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("reference", ["corrupt", "mean"])
def test_circuit_values_equal_the_patched_runs_of_every_mask(pair, reference):
    """circuit_values runs each distinct mask once and takes the model and (corrupt reference) the empty circuit
    from the plain runs: its rows equal the patched pass of every mask, a repeated mask and the mean reference
    (which no plain run gives) included."""
    from resid.analyses.circuits.evaluation import circuit_values
    from resid.analyses.circuits.inputs import measure

    _, model = pair
    graph = Seq2SeqGraph.of(model)
    (source, target), (corrupt_source, corrupt_target) = sides(seed=3)
    clean = (Tokens.from_ids(source), Tokens.from_ids(target))
    corrupt = (Tokens.from_ids(corrupt_source), Tokens.from_ids(corrupt_target))
    g = torch.Generator().manual_seed(1)
    some = graph.valid & (torch.rand(graph.valid.shape, generator=g) < 0.3)
    masks = [some, graph.full(), some]
    t, b = torch.tensor([5, 6]), torch.tensor([7, 8])
    got = circuit_values(model, graph, clean, corrupt, t, b, "logit_diff", masks, reference)
    every = torch.stack([*masks, graph.full(), graph.empty()]).float()
    logits = logits_with(model, graph, clean, writes_of(model, corrupt, reference), every)
    expected = measure("logit_diff", logits.flatten(0, 1), t.repeat(len(every)), b.repeat(len(every))).view(
        len(every), -1)
    assert got.shape == expected.shape == (5, 2)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert float((expected[0] - expected[4]).abs().max()) > 1e-3  # the circuit matters
