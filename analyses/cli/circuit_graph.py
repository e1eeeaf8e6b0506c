"""`resid circuit --graph g.json` or `resid circuit --prompt "..." --transcoders DIR`: an attribution graph's circuit
(resid.analyses.graphs.circuit): the features that carry the logits' influence grouped into supernodes with their
reasons, the circuit's subgraph scores, and, with --transcoders, the features' labels and the circuit measured in
the model (necessity, sufficiency, each supernode ablated and steered, beside the graph's predictions).

--graph reads a graph's viewer JSON (resid graph --out, graphs.write_json, or circuit-tracer's of the same format).
With --transcoders the graph is recomputed from the JSON's tokens (the full graph: its subgraph scores merge every
feature left out, not only those the JSON kept, as circuit-tracer's PR #42 advises); without, the JSON's pruned graph
is the graph (no labels, no measurements). --out DIR writes circuit.json (the graph's JSON with the supernodes in
qParams.supernodes, the circuit's features pinned, labels as each node's clerp and the scores under
metadata.resid.circuit: Neuronpedia reads it), circuit.html (resid's viewer opening on the circuit), report.html (one
page: diagram, scores, measurements, features), circuit.csv (its features) and interventions.csv; --png adds
report.png (headless Chromium). --examples TABLE (features.top_activating's table, .csv or .parquet) adds each
feature's top context to its label.

This module gives `add_arguments(parser)` (all but --out, which is the command's), `check(args)` and
`run(model, args)`; `resid circuit` (resid.analyses.cli.circuit) dispatches here when --graph or --prompt is given.
"""

from pathlib import Path

from resid.errors import ResidError

SHOWN = 8  # features printed per supernode


def add_arguments(parser) -> None:
    parser.add_argument("--graph", default=None, help="a graph's viewer JSON (resid graph --out)")
    parser.add_argument("--prompt", default=None, help="or the prompt whose graph is computed first")
    parser.add_argument("--transcoders", default=None, help="the graph's transcoders (a local folder): labels, the "
                        "full graph and the measurements in the model; required with --prompt")
    parser.add_argument("--node-threshold", type=float, default=0.8, help="share of the logits' influence the "
                        "circuit's nodes hold (default 0.8)")
    parser.add_argument("--edge-threshold", type=float, default=0.98, help="share of edge influence the kept "
                        "edges hold (default 0.98)")
    parser.add_argument("--max-supernodes", type=int, default=12, help="at most this many supernodes (default 12)")
    parser.add_argument("--steer", type=float, default=2.0, help="each supernode steered: its features' "
                        "activations times this (default 2)")
    parser.add_argument("--examples", default=None, help="features.top_activating's table (.csv, .parquet): each "
                        "feature's top context in its label")
    parser.add_argument("--no-measure", action="store_true", help="skip the interventions in the model")
    parser.add_argument("--png", action="store_true", help="also report.png (needs headless Chromium)")


def check(args) -> None:
    if (args.graph is None) == (args.prompt is None):
        raise ResidError("resid circuit needs a graph: give --graph g.json (a graph's viewer JSON) or --prompt TEXT "
                         "with --transcoders DIR (the graph is computed first), one of the two.")
    if args.prompt is not None and args.transcoders is None:
        raise ResidError("--prompt computes the prompt's graph, which needs its transcoders: give --transcoders DIR.")
    if args.graph is not None and not Path(args.graph).is_file():
        raise ResidError(f"--graph {args.graph} is not a file: give the JSON resid graph --out wrote.")
    if args.transcoders is not None and not Path(args.transcoders).expanduser().is_dir():
        raise ResidError(f"--transcoders {args.transcoders} is not a folder: give a local transcoder folder.")
    for flag, value in (("--node-threshold", args.node_threshold), ("--edge-threshold", args.edge_threshold)):
        if not 0 <= value <= 1:
            raise ResidError(f"{flag} {value} is a share: give a number in [0, 1].")
    if args.max_supernodes < 1:
        raise ResidError(f"--max-supernodes {args.max_supernodes}: give at least 1.")
    if args.png and args.out is None:
        raise ResidError("--png writes report.png into --out: give --out DIR too.")
    if args.examples is not None and Path(args.examples).suffix not in (".csv", ".parquet"):
        raise ResidError(f"--examples {args.examples}: give features.top_activating's table as .csv or .parquet.")


def run(model, args) -> str:
    import pandas as pd

    from resid.analyses import graphs
    from resid.analyses.cli.graph import load_transcoders
    from resid.analyses.graphs import circuit_report
    from resid.analyses.graphs.export import read_json
    from resid.analyses.graphs.viewer import write_html
    from resid.analyses.io import tables
    from resid.analyses.io.provenance import describe

    transcoders = load_transcoders(args.transcoders, model) if args.transcoders is not None else None
    if args.graph is not None:
        graph = read_json(args.graph)
        if transcoders is not None:
            graph = graphs.attribute(model, graph.token_ids, transcoders, skip_bos=graph.skip_bos)
    else:
        graph = graphs.attribute(model, args.prompt, transcoders)
    table = None
    if transcoders is not None:
        examples = None
        if args.examples is not None:
            examples = (pd.read_parquet(args.examples) if args.examples.endswith(".parquet")
                        else pd.read_csv(args.examples))
        pruned = graph.prune(args.node_threshold, args.edge_threshold).node_mask[:graph.n_features]
        table = graphs.labels(model, graph, transcoders, examples=examples, nodes=pruned.nonzero().flatten())
    found = graphs.circuit(graph, args.node_threshold, args.edge_threshold, args.max_supernodes, labels=table)
    measured = None
    if transcoders is not None and not args.no_measure:
        measured = graphs.measure(model, found, transcoders, steer=args.steer)
    lines = [f"graph: {graph!r}", f"circuit: {found!r}"]
    lines += [f"  {name:<8} replacement {r:.4f}  completeness {c:.4f}" for name, (r, c) in found.scores.items()]
    if measured is not None:
        lines.append(f"necessity {measured.attrs['necessity']:.4f}   sufficiency {measured.attrs['sufficiency']:.4f}"
                     f"   (target {measured.attrs['target']!r})")
    frame = found.to_frame()
    for s in found.supernodes:
        lines.append(f"supernode {s.name!r}: {len(s.nodes)} features, influence {s.influence:.4f}")
        lines += [f"    why: {reason}" for reason in s.reasons]
        if measured is not None:
            for row in measured[measured["supernode"] == s.name].itertuples():
                lines.append(f"    {row.intervention:<6} measured {row.measured_change:+.4f}  "
                             f"predicted {row.predicted_change:+.4f}")
        for row in frame[frame["supernode"] == s.name].head(SHOWN).itertuples():
            lines.append(f"    {row.node_id:<14} {row.token_str!r:<12} {row.label}")
    if args.out is not None:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        kwargs = dict(node_threshold=args.node_threshold, edge_threshold=args.edge_threshold, circuit=found,
                      measured=measured)
        written = [graphs.write_json(graph, out / "circuit.json", **kwargs),
                   write_html(graph, out / "circuit.html", **kwargs),
                   circuit_report.write(model, found, out / "report.html", measured),
                   tables.export(frame, out / "circuit.csv", describe(model, "resid circuit", {
                       "graph": args.graph, "prompt": args.prompt, "transcoders": args.transcoders,
                       "node_threshold": args.node_threshold, "edge_threshold": args.edge_threshold,
                       "max_supernodes": args.max_supernodes}))]
        if measured is not None:
            written.append(tables.export(measured, out / "interventions.csv"))
        if args.png:
            written.append(circuit_report.png(out / "report.html", out / "report.png"))
        lines.append("wrote " + ", ".join(str(p) for p in written))
    return "\n".join(lines)
