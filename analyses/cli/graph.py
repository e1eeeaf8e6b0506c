"""`resid graph "prompt" --transcoders DIR --out g.json`: the attribution graph of the prompt's next-token
prediction (resid.analyses.graphs): every MLP replaced by its transcoder, patterns and norm scales frozen, edges
the exact direct effects. Prints the logit nodes, the scores and the most influential features; writes the pruned
graph as the JSON circuit-tracer's and Neuronpedia's viewers read (with graph-metadata.json beside it) and resid's
own viewer page next to it (g.html).

--transcoders is a local folder resid.dictionaries.load reads as one transcoder per layer (a circuit-tracer set, a
sparsify set) or as a cross-layer transcoder, or a folder of single-transcoder folders (what `resid
train-transcoder --layers all --out DIR` writes: one SAELens folder per layer). --validate K ablates the K most
influential features in the real model and reports the measured effects beside the graph's predictions. --heads
splits each edge of the pruned graph by the attention head of its last hop (resid.analyses.graphs.heads) and writes
the split beside the JSON (g-heads.csv: source_site, target_site, via, weight, with its provenance sidecar) and into
the JSON's links and the page, with QK attribution for the heads that carry the edges (resid.analyses.graphs.qk: for
each edge's QK_PER_EDGE strongest heads, at most QK_LIMIT, why the head attended from the edge's target position to
its source position), which the page shows when such a head is clicked. --ray [ADDRESS] --workers N run the graph's
backward sweeps on Ray workers (each loads the model and runs the replacement once; the graph is the same).
"""

from pathlib import Path

from resid.analyses.cli import arguments
from resid.errors import ResidError

SHOWN = 10  # features printed
QK_PER_EDGE, QK_LIMIT = 3, 200  # --heads: heads per edge explained by QK attribution, and at most this many


def add_parser(commands, common) -> None:
    parser = commands.add_parser("graph", parents=[common], help="attribution graph through transcoder features")
    parser.add_argument("text", help="the prompt whose next-token prediction is traced")
    parser.add_argument("--transcoders", required=True, help="a local folder: one transcoder per layer or a "
                        "cross-layer transcoder (circuit-tracer, SAELens, sparsify)")
    parser.add_argument("--out", default=None, help="a file (.json) for the pruned graph; the viewer page is "
                        "written beside it (.html)")
    parser.add_argument("--node-threshold", type=float, default=0.8, help="share of influence the kept nodes hold "
                        "(default 0.8)")
    parser.add_argument("--edge-threshold", type=float, default=0.98, help="share of edge influence the kept edges "
                        "hold (default 0.98)")
    parser.add_argument("--max-feature-nodes", type=int, default=None, help="visit at most this many features, "
                        "the most influential first (default: all)")
    parser.add_argument("--max-n-logits", type=int, default=10, help="at most this many logit nodes (default 10)")
    parser.add_argument("--desired-logit-prob", type=float, default=0.95, help="logit nodes until their "
                        "probabilities sum to this (default 0.95)")
    parser.add_argument("--batch-size", default="auto", help="targets per backward sweep, or auto (64)")
    parser.add_argument("--bos", default="auto", choices=["auto", "skip", "keep"], help="position 0's features and "
                        "errors: 'skip' makes them constants, not nodes, as circuit-tracer does for a BOS token; "
                        "'auto' (default) skips them when the prompt starts with the BOS token")
    parser.add_argument("--validate", type=int, default=0, help="ablate the K most influential features in the "
                        "real model and compare with the graph (default 0: no check)")
    parser.add_argument("--heads", action="store_true", help="split the pruned graph's edges by the attention head "
                        "of their last hop: written beside --out (<stem>-heads.csv) and into the JSON and page")
    arguments.executor_options(parser)  # the backward sweeps on Ray workers, each running the replacement once


def check(args) -> None:
    if not args.text:  # before the model loads
        raise ResidError("The prompt is empty: resid graph traces the prediction that follows a prompt, so it needs "
                         "at least one token. Give one, e.g. resid graph 'The capital of France is' --transcoders DIR.")
    arguments.at_least(args.max_n_logits, 1, "--max-n-logits")
    args.batch_size = arguments.batch_size(args.batch_size)
    arguments.at_least(args.validate, 0, "--validate")
    if args.max_feature_nodes is not None:
        arguments.at_least(args.max_feature_nodes, 0, "--max-feature-nodes")
    for flag, value in (("--node-threshold", args.node_threshold), ("--edge-threshold", args.edge_threshold),
                        ("--desired-logit-prob", args.desired_logit_prob)):
        if not 0 <= value <= 1:
            raise ResidError(f"{flag} {value} is a share: give a number in [0, 1].")
    arguments.out_path(args.out, (".json",))
    if args.heads and args.out is None:
        raise ResidError("--heads writes the head split beside the graph's JSON: give --out too (e.g. --out g.json, "
                         "which writes g-heads.csv beside it).")
    if not Path(args.transcoders).expanduser().is_dir():
        raise ResidError(f"--transcoders {args.transcoders} is not a folder: give a local transcoder folder (a "
                         "circuit-tracer set with its config.yaml, or per-layer SAELens / sparsify transcoders).")
    args.executor = arguments.executor(args.ray, args.workers)  # last: nothing to close if a check above fails


def run(model, args) -> str:
    from resid.analyses import graphs
    from resid.analyses.graphs.validate import validate
    from resid.analyses.graphs.viewer import write_html
    from resid.analyses.io import tables

    transcoders = load_transcoders(args.transcoders, model)
    notes = []
    max_n_logits = min(args.max_n_logits, model.config.d_vocab)  # each logit node costs a row of the graph
    if max_n_logits < args.max_n_logits:
        notes.append(f"note: at most {max_n_logits:,} logit nodes, the vocabulary's size (--max-n-logits "
                     f"{args.max_n_logits:,} is more than {model.name} has tokens)")
    try:
        graph = graphs.attribute(model, args.text, transcoders, max_n_logits=max_n_logits,
                                 desired_logit_prob=args.desired_logit_prob, max_feature_nodes=args.max_feature_nodes,
                                 skip_bos={"auto": None, "skip": True, "keep": False}[args.bos],
                                 execution=arguments.execution(args.batch_size, executor=args.executor))
    finally:
        if args.executor is not None:
            args.executor.close()
    if args.validate:
        validate(model, graph, transcoders, top=args.validate)
    replacement, completeness = graph.scores()
    lines = [f"model: {model.name}   prompt: {graph.n_pos} tokens   transcoders: "
             f"{summary(transcoders, args.transcoders)}",
             f"{graph.n_features} feature nodes (of {len(graph.active_features)} active), {graph.n_errors} error, "
             f"{graph.n_pos} token, {graph.n_logits} logit nodes; {graph.n_edges} edges",
             f"replacement score {replacement:.4f}   completeness score {completeness:.4f}", *notes, "logit nodes:"]
    for token, text, p in zip(graph.logit_tokens.tolist(), graph.logit_strs, graph.logit_probabilities.tolist(),
                              strict=True):
        lines.append(f"  {p:7.4f}  {token:>6}  {text!r}")
    frame = graph.to_frame()
    top = frame[frame["kind"] == "feature"].nlargest(SHOWN, "influence")
    lines.append(f"most influential features (of {graph.n_features}):")
    lines += [f"  {row.site:<32} activation {row.activation:9.4f}  influence {row.influence:.4f}"
              for row in top.itertuples()]
    if args.validate:
        report = graph.metadata["validation"]
        lines.append(f"validation: {len(report['features'])} features ablated in the real model; target logit "
                     f"effect predicted vs measured: correlation {report['target_logit_correlation']:.3f}")
    if args.out is not None:
        split = qk = None
        if args.heads:
            pruned = graph.pruned(args.node_threshold, args.edge_threshold)
            split = graphs.split_heads(model, pruned, transcoders, execution=arguments.execution(args.batch_size))
            table = tables.export(split.to_frame(), heads_path(args.out))
            lines.append(f"head split: {split.n_edges} edges of the pruned graph by the head of their last attention "
                         f"hop; wrote {table}")
            carriers = split.carriers(QK_PER_EDGE, QK_LIMIT)
            qk = graphs.QK(model, graph.token_ids, transcoders, skip_bos=graph.skip_bos).summaries(carriers)
            lines.append(f"QK attribution: why {len(qk)} heads carrying the edges attended where they did (in the "
                         "JSON's 'qk' and the page)")
        path = graphs.write_json(graph, args.out, node_threshold=args.node_threshold,
                                 edge_threshold=args.edge_threshold, heads=split, qk=qk)
        page = write_html(graph, Path(path).with_suffix(".html"), node_threshold=args.node_threshold,
                          edge_threshold=args.edge_threshold, heads=split, qk=qk)
        lines.append(f"wrote {path} (+ graph-metadata.json) and {page}")
    return "\n".join(lines)


def heads_path(out: str) -> Path:
    """Where --heads writes the split: beside the JSON, <stem>-heads.csv."""
    path = Path(out)
    return path.with_name(f"{path.stem}-heads.csv")


def summary(transcoders, folder: str) -> str:
    """The transcoders in a few words (their names, 30 of them, made the first line thousands of characters)."""
    from resid.dictionaries import CrossLayerTranscoder

    if isinstance(transcoders, CrossLayerTranscoder):
        return f"cross-layer transcoder {transcoders.name!r} ({transcoders.n_layers} layers) from {folder}"
    if not isinstance(transcoders, list):
        transcoders = [transcoders]
    sites = sorted((d.point_out.site for d in transcoders), key=lambda site: site.layer)
    span = sites[0].label if len(sites) == 1 else f"{sites[0].label} .. {sites[-1].label}"
    return f"{len(sites)} ({span}) from {folder}"


def load_transcoders(folder: str, model):
    """The transcoders of `folder`, as resid.dictionaries.load reads it (a folder of dictionary folders included)."""
    import resid.dictionaries

    return resid.dictionaries.load(Path(folder).expanduser(), model)
