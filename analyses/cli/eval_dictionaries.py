"""`resid eval-dictionaries`: compare sets of transcoders as replacements of every MLP, on held-out paragraphs and by
the attribution graphs they give (resid.analyses.training.evaluate_replacements).

    resid eval-dictionaries per-layer=runs/tc skip=runs/skip clt=runs/clt/clt --out comparison \\
        --prompt "The Eiffel Tower is in the city of" --prompt "The opposite of hot is"

Each REPLACEMENT is a local folder resid.dictionaries.load reads as one transcoder per layer or one cross-layer
transcoder (a `resid train-transcoder` or `train-clt` output, a circuit-tracer set), optionally named NAME=FOLDER
(default: the folder's name). The held-out paragraphs are split from the corpus as `resid train-*` splits them
(--corpus, --max-docs, --held-out), so a dictionary trained there is evaluated on paragraphs it never saw.

--out gets evaluation.md (the table), per-layer.csv (FVU, L0, dead and dense fractions per replacement and layer),
report.html (both, and the per-layer FVU as a figure) and, with prompts, graph-NAME.html: the first prompt's graph
from each replacement in the viewer.
"""

import re
from pathlib import Path

from resid.analyses.cli import arguments
from resid.analyses.cli.lens_data import corpus_options, held_out_split
from resid.errors import ResidError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # a replacement's name: one plain file name part, never a path
SHOWN = ("replacement", "kind", "features", "fvu", "l0", "dead_fraction", "ce_loss_recovered", "kl_spliced",
         "replacement_score", "completeness_score")


def add_parser(commands, common) -> None:
    parser = commands.add_parser("eval-dictionaries", parents=[common], help="compare sets of transcoders replacing "
                                 "every MLP: FVU, L0, dead features, CE loss recovered, KL, graph scores")
    parser.set_defaults(command="eval_dictionaries")
    parser.add_argument("replacements", nargs="+", metavar="[NAME=]FOLDER",
                        help="per-layer transcoders or a cross-layer transcoder, each a local folder")
    parser.add_argument("--out", required=True, help="a folder: evaluation.md, per-layer.csv, report.html, graphs")
    parser.add_argument("--prompt", action="append", default=[], help="a prompt whose graph is scored (repeat it; "
                        "none: no graph scores)")
    corpus_options(parser)
    parser.add_argument("--eval-windows", type=int, default=32, help="held-out windows (default 32)")
    parser.add_argument("--window", type=int, default=128, help="tokens per window (default 128)")
    parser.add_argument("--batch-size", type=int, default=4, help="windows per forward pass (default 4)")
    parser.add_argument("--max-feature-nodes", type=int, default=None, help="visit at most this many features per "
                        "graph (default: every active feature)")
    parser.add_argument("--keep-bos", action="store_true", help="score each window's first position too")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    arguments.self_contained(parser)
    arguments.executor_options(parser)


def check(args) -> None:
    for flag in ("eval_windows", "window", "batch_size"):
        arguments.at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    if args.max_feature_nodes is not None:
        arguments.at_least(args.max_feature_nodes, 0, "--max-feature-nodes")
    if any(not p for p in args.prompt):
        raise ResidError("--prompt '' is empty: a graph traces the prediction after a prompt; give text, e.g. "
                         "--prompt 'The Eiffel Tower is in the city of'.")
    arguments.out_folder(args.out)
    args.named = {}
    for given in args.replacements:
        name, _, folder = given.rpartition("=") if "=" in given else ("", "", given)
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise ResidError(f"{given}: {folder} is not a folder. Give each replacement as a local folder of "
                             "transcoders (a resid train-transcoder or train-clt output, a circuit-tracer set), "
                             "optionally NAME=FOLDER.")
        name = name or path.resolve().name  # "." and ".." are named by the folder they stand for
        if not NAME.fullmatch(name):
            raise ResidError(f"{given}: the replacement's name {name!r} names files in --out (graph-NAME.html), so it "
                             "must be letters, digits, '_', '-' and '.', starting with a letter or digit (at most 100 "
                             "characters). Name it with NAME=FOLDER, e.g. clt=" + folder + ".")
        if name in args.named:
            raise ResidError(f"Two replacements are named {name!r}: name them apart with NAME=FOLDER.")
        args.named[name] = path
    held_out_split(args)
    args.executor = arguments.executor(args.ray, args.workers)  # last: nothing to close if a check above fails


def run(model, args) -> str:
    import resid.dictionaries
    from resid.analyses.distributed.execution import Execution
    from resid.analyses.graphs.viewer import write_html
    from resid.analyses.io import tables
    from resid.analyses.training.replacements import evaluate_replacements

    replacements = {name: resid.dictionaries.load(path, model) for name, path in args.named.items()}
    held_out = args.split(model)[1]
    try:
        scores = evaluate_replacements(
            model, replacements, held_out, prompts=args.prompt, max_windows=args.eval_windows, window=args.window,
            keep_bos=args.keep_bos, max_feature_nodes=args.max_feature_nodes, keep_graphs=bool(args.prompt),
            execution=Execution(args.executor, batch_size=args.batch_size, progress=False if args.quiet else None))
    finally:
        if args.executor is not None:
            args.executor.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = [tables.export(scores.table, out / "evaluation.md"), tables.export(scores.per_layer, out / "per-layer.csv")]
    graphs = {}
    for name, found in scores.graphs.items():
        graphs[name] = write_html(found[0], out / f"graph-{name}.html")
        files.append(graphs[name])
    files.append(_report(model, args, scores, graphs, out / "report.html"))
    shown = scores.table[list(SHOWN)]
    lines = [f"{len(replacements)} replacement(s) of every MLP of {model.name} over {scores.table['tokens'].iloc[0]:,} "
             f"held-out tokens" + (f" and {len(args.prompt)} prompt graph(s)" if args.prompt else ""),
             shown.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="--"),
             "wrote " + ", ".join(str(f) for f in files)]
    return "\n".join(lines)


def _report(model, args, scores, graphs: dict, path: Path) -> Path:
    import plotly.graph_objects as go

    from resid.analyses import report

    figure = go.Figure([go.Scatter(x=part["layer"], y=part["fvu"], mode="lines+markers", name=name)
                        for name, part in scores.per_layer.groupby("replacement", sort=False)])
    figure.update_layout(xaxis_title="layer", yaxis_title="FVU of the layer's MLP write", height=380)
    scored = (f"The graph scores are the mean over {len(args.prompt)} prompt(s) of circuit-tracer's replacement score "
              "(the share of the logits' influence reaching tokens rather than error nodes) and completeness score."
              if args.prompt else "No prompts were given, so no graph scores.")
    parts = ["Each replacement stands in for every MLP of the model at once. FVU is pooled over the layers, L0 summed "
             "over them; CE loss recovered and KL compare the model with every MLP write replaced by its "
             "reconstruction against the model itself and against every MLP write zeroed.", scored,
             report.Table(scores.table, rows=len(scores.table), full="evaluation.md")]
    if graphs:
        parts.append("The first prompt's graph from each: " + ", ".join(f"{p.name}" for p in graphs.values()) + ".")
    page = report.Page(f"resid eval-dictionaries: {', '.join(scores.table['replacement'])}",
                       report.context(model, "replacements of every MLP", args.prompt),
                       [report.Section("Replacements", parts),
                        report.Section("Per layer", [figure, report.Table(scores.per_layer, full="per-layer.csv")])])
    return report.write(page, path, args.self_contained)
