"""`resid circuit --pairs pairs.jsonl --method eap --out edges.parquet`: edge circuits (resid.analyses.circuits):
every edge scored by EAP, EAP-IG or exact patching over (clean, corrupt) pairs, the faithfulness curve of the top-k
circuits (MIB's CPR and CMD), and one circuit drawn (--k edges, or those with |score| >= --threshold).

Where the pairs come from (one source):
    --pairs FILE                JSONL, one {"clean": ..., "corrupt": ..., "target": ..., "baseline": ...} per line
    --clean T --corrupt T --target T [--baseline T]     one pair on the command line

Outputs: --out (the edge table: .parquet .csv .tex .md), --curve (the faithfulness curve's table, default
OUT-curve.csv), --figure (the circuit as an HTML page, default OUT.html).

Or an attribution graph's circuit of features in supernodes: `resid circuit --graph g.json [--transcoders DIR]` or
`--prompt TEXT --transcoders DIR`, --out a folder (resid.analyses.cli.circuit_graph, where those options are).
"""

from pathlib import Path

from resid.analyses.cli import arguments, circuit_graph
from resid.analyses.io import suffixes
from resid.errors import ResidError

EXAMPLE = '{"clean": "When Mary and John went to the store, John gave a drink to", "corrupt": "When Mary and John ' \
          'went to the store, Mary gave a drink to", "target": " Mary", "baseline": " John"}'
METHODS = ("eap", "eap-ig", "exact")


def add_parser(commands, common) -> None:
    circuit = commands.add_parser("circuit", parents=[common], help="edge circuits: EAP, EAP-IG, exact; MIB's "
                                  "faithfulness, CPR and CMD")
    source = circuit.add_argument_group("pairs (one source)")
    source.add_argument("--pairs", default=None, help='JSONL: {"clean": ..., "corrupt": ..., "target": ..., '
                        '"baseline": ...} per line')
    source.add_argument("--clean", default=None, help="one clean prompt (with --corrupt and --target)")
    source.add_argument("--corrupt", default=None, help="its corrupt prompt, of the same token length")
    source.add_argument("--target", default=None, help="the target token")
    source.add_argument("--baseline", default=None, help="the baseline token (metric logit_diff)")
    circuit.add_argument("--method", default="eap", choices=METHODS,
                         help="eap (one backward pass), eap-ig (integrated gradients, --steps), exact (each edge "
                         "patched alone: one forward row per edge and pair)")
    circuit.add_argument("--steps", type=int, default=5, help="eap-ig: integration steps (default 5)")
    circuit.add_argument("--on", default="inputs", choices=["inputs", "activations"],
                         help="eap-ig: interpolate the input embeddings (default) or every edge's activations")
    circuit.add_argument("--metric", default=None, choices=["logit_diff", "logit", "target_prob", "loss", "kl"])
    circuit.add_argument("--reference", default="corrupt", choices=["corrupt", "mean"],
                         help="what an edge outside the circuit carries: its corrupt value, or its mean")
    circuit.add_argument("--k", type=int, default=None, help="the circuit drawn: the top K edges (default: the "
                         "smallest size of the curve whose faithfulness reaches 0.8)")
    circuit.add_argument("--threshold", type=float, default=None, help="the circuit drawn: edges with |score| >= T")
    circuit.add_argument("--fractions", default=None,
                         help="comma-separated edge fractions of the curve (default MIB's 0.001,...,1)")
    circuit.add_argument("--batch-size", default="auto", help="pairs per forward pass, or auto")
    circuit.add_argument("--out", default=None, help="a file (.parquet .csv .tex .md): the edge table, required for "
                         "edges; with --graph / --prompt a folder for the circuit's JSON, pages and tables")
    circuit.add_argument("--curve", default=None, help="the curve's table (default: OUT-curve.csv)")
    circuit.add_argument("--figure", default=None, help="the circuit's page (.html; default: OUT.html)")
    arguments.executor_options(circuit)
    arguments.quiet(circuit)
    circuit_graph.add_arguments(circuit.add_argument_group("or an attribution graph's circuit (instead of pairs)"))


def from_graph(args) -> bool:
    """Whether the command asks for an attribution graph's circuit (--graph or --prompt) rather than edges."""
    return args.graph is not None or args.prompt is not None


def check(args) -> None:
    """Reads the pairs (a bad line is reported before the model loads) into `args.pairs_read`."""
    if from_graph(args):
        given = [flag for flag, value in (("--pairs", args.pairs), ("--clean", args.clean),
                                          ("--corrupt", args.corrupt), ("--target", args.target)) if value]
        if given:
            raise ResidError(f"resid circuit takes pairs ({', '.join(given)}: edge circuits) or an attribution "
                             "graph (--graph / --prompt: a circuit of features), not both.")
        return circuit_graph.check(args)
    if args.out is None:
        raise ResidError("resid circuit needs --out: the edge table (.parquet, .csv, .tex or .md).")
    args.batch_size = arguments.batch_size(args.batch_size)
    arguments.out_path(args.out, (*suffixes.STORE, ".tex", ".md"))
    arguments.out_path(args.curve, (*suffixes.STORE, ".tex", ".md"), "--curve")
    arguments.out_path(args.figure, (".html",), "--figure")
    if args.k is not None and args.threshold is not None:
        raise ResidError("--k and --threshold both choose the circuit drawn: give one.")
    if args.steps < 1:
        raise ResidError(f"--steps must be a positive number of integration steps, got {args.steps}.")
    args.fraction_list = _fractions(args.fractions)
    args.pairs_read = _pairs(args)
    args.executor = arguments.executor(args.ray, args.workers)


def _fractions(text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ResidError(f"--fractions takes comma-separated numbers in (0, 1], e.g. 0.01,0.1,1; got {text!r}."
                         ) from None
    if any(not 0 < v <= 1 for v in values) or list(values) != sorted(values):
        raise ResidError(f"--fractions must be increasing numbers in (0, 1], got {text!r}.")
    return values


def _pairs(args) -> list[dict]:
    """The pairs of the one source given (see the module docstring)."""
    from resid.analyses.io import prompts_file, texts

    inline = [args.clean, args.corrupt, args.target]
    if args.pairs is not None and any(v is not None for v in (*inline, args.baseline)):
        raise ResidError("Give the pairs one way: --pairs FILE, or --clean/--corrupt/--target (--baseline).")
    if args.pairs is None:
        if any(v is None for v in inline):
            raise ResidError("Give --pairs FILE, or one pair as --clean TEXT --corrupt TEXT --target TOKEN "
                             "(--baseline TOKEN).")
        return [{"clean": args.clean, "corrupt": args.corrupt, "target": args.target, "baseline": args.baseline}]
    numbered = texts.records(args.pairs, {"clean": str, "corrupt": str, "target": object}, EXAMPLE, "pairs")
    prompts_file.check_tokens(args.pairs, numbered, example=EXAMPLE, required=("target",))
    found = [record for _, record in numbered]
    if not found:
        raise ResidError(f"{args.pairs} holds no pairs: give one {EXAMPLE} object per line.")
    with_baseline = [r.get("baseline") is not None for r in found]
    if any(with_baseline) and not all(with_baseline):
        raise ResidError(f"{args.pairs}: give every line a baseline, or none.")
    return found


def run(model, args) -> str:
    if from_graph(args):
        return circuit_graph.run(model, args)
    from resid.analyses import circuits, tables

    found = args.pairs_read
    clean, corrupt = [r["clean"] for r in found], [r["corrupt"] for r in found]
    targets = [r["target"] for r in found]
    baselines = [r["baseline"] for r in found] if found[0].get("baseline") is not None else None
    execution = arguments.execution(args.batch_size, args.quiet, args.executor)
    common = dict(metric=args.metric, execution=execution)
    try:
        if args.method == "eap":
            scores = circuits.eap(model, clean, corrupt, targets, baselines, **common)
        elif args.method == "eap-ig":
            scores = circuits.eap_ig(model, clean, corrupt, targets, baselines, steps=args.steps, on=args.on,
                                     **common)
        else:
            scores = circuits.exact(model, clean, corrupt, targets, baselines, reference=args.reference, **common)
        curve = circuits.faithfulness_curve(model, clean, corrupt, targets, scores, baselines,
                                            fractions=args.fraction_list or circuits.MIB_FRACTIONS,
                                            reference=args.reference, **common)
    finally:
        if args.executor is not None:
            args.executor.close()
    out = tables.export(scores, args.out)
    curve_out = tables.export(curve, args.curve or _beside(args.out, "-curve.csv"))
    figure = _draw(model, args, scores, curve)
    lines = [f"{len(scores)} edges scored by {args.method} over {len(found)} pairs -> {out}",
             f"faithfulness curve -> {curve_out}: CPR {circuits.cpr(curve):.4f}, CMD {circuits.cmd(curve):.4f}",
             f"circuit -> {figure}",
             f"{'fraction':>9} {'edges':>7} {'faithfulness':>13}"]
    lines += [f"{f:>9.3f} {e:>7d} {v:>13.4f}" for f, e, v in zip(curve["fraction"], curve["edges"],
                                                                      curve["faithfulness"])]
    return "\n".join(lines)


def _beside(out: str, suffix: str) -> Path:
    path = Path(out)
    return path.with_name(path.stem + suffix)


def _draw(model, args, scores, curve) -> Path:
    """The circuit of --k / --threshold, or the curve's smallest circuit whose faithfulness reaches 0.8 (its
    largest otherwise), drawn as a page."""
    from resid.analyses import circuits
    from resid.analyses.circuits.figure import page

    graph = circuits.EdgeGraph.of(model.config)
    matrix = circuits.matrix(graph, scores)
    if args.threshold is not None:
        mask, name = circuits.threshold(graph, matrix, args.threshold), f"|score| >= {args.threshold}"
    else:
        k = args.k
        if k is None:
            reached = curve[curve["faithfulness"] >= 0.8]
            k = int((reached if len(reached) else curve).iloc[0 if len(reached) else -1]["k"])
        mask, name = circuits.top_k(graph, matrix, k), f"top {k} edges"
    title = f"{args.method} circuit, {name} ({int(mask.sum())} after pruning)"
    return page(graph, mask, matrix, args.figure or _beside(args.out, ".html"), title)
