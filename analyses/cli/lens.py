"""`resid lens "prompt"`: the logit lens (or a tuned lens) as a compact table, optionally written as a table and a
heatmap.

    resid lens "The Eiffel Tower is located in the city of" --target " Paris" --norm frozen
    resid lens "..." --positions all --out lens.csv   # + lens.csv.json, lens.html (a page: heatmap and top rows)
    resid lens "..." --lens tuned --translators DIR   # a tuned lens from `resid lens train` (or tuned-lens's files)
    resid lens "..." --jlens DIR                      # a J-lens from `resid lens fit-jacobian` (or the reference's .pt)

Training and evaluating tuned lenses: `resid lens train` and `resid lens eval` (lens_train.py, lens_eval.py).
"""

from pathlib import Path

from resid.analyses.cli import arguments, output, sources


def add_parser(commands, common) -> None:
    parser = commands.add_parser("lens", parents=[common], help="logit lens table and heatmap (scripts)")
    parser.add_argument("text", help="the prompt to read through the lens")
    parser.add_argument("--target", default=None, help="target token (default: the top prediction at each position)")
    parser.add_argument("--positions", default="-1", help="'all', or comma-separated prompt positions (default -1)")
    parser.add_argument("--every", default="layer", choices=["layer", "sublayer"],
                        help="read the residual after every layer (default), or also between attention and MLP")
    parser.add_argument("--norm", default="recompute", choices=["recompute", "frozen"],
                        help="final norm: recomputed on each partial residual (default), or its scale frozen "
                             "from the full run")
    parser.add_argument("--lens", default=None, choices=["logit", "tuned", "jacobian"],
                        help="logit lens (default), tuned lens (needs --translators) or J-lens (needs --jlens)")
    parser.add_argument("--jlens", default=None, help="a J-lens's folder (`resid lens fit-jacobian`) or the "
                        "reference's .pt file; implies --lens jacobian")
    parser.add_argument("--translators", default=None, help="the tuned lens's folder (resid's translators.safetensors "
                        "or tuned-lens's config.json + params.pt); implies --lens tuned")
    parser.add_argument("--skip-unembedding-check", action="store_true",
                        help="read a tuned lens trained on other weights of the model (e.g. unquantized)")
    parser.add_argument("--k", type=int, default=5, help="top tokens kept per site (default 5)")
    parser.add_argument("--out", default=None, help="a file (.csv .parquet .tex .md): the table; the heatmap (.html) "
                        "goes beside it")
    arguments.self_contained(parser)
    sources.add_source(parser)


def check(args) -> None:
    from resid.analyses.io import suffixes

    args.positions = arguments.positions(args.positions)  # 'all' or a list of ints from here on
    arguments.at_least(args.k, 1, "--k")
    arguments.out_path(args.out, suffixes.TABLE)
    from resid.errors import ResidError

    if args.lens == "jacobian" and not args.jlens:
        raise ResidError("--lens jacobian needs --jlens: the folder `resid lens fit-jacobian` wrote (or the "
                         "reference's .pt file).")
    if args.jlens and (args.lens in ("logit", "tuned") or args.translators):
        raise ResidError("--jlens is the J-lens: drop --lens logit / tuned and --translators (one lens at a time).")
    args.loaded = arguments.translators(None if args.jlens else args.lens, args.translators)  # before the model


def run(model, args) -> str:
    from resid.analyses import logit_lens, report, tables
    from resid.analyses.lenses import LogitLens, formats
    from resid.seq2seq import EncoderDecoder
    from resid.sites import Site

    frozen = args.norm == "frozen"
    read = model.decoder if isinstance(model, EncoderDecoder) else model  # the model whose prediction is lensed
    if args.jlens:
        lens = formats.read_jacobian(read, args.jlens).with_frozen_norm(frozen)
    elif args.loaded is not None:
        lens = formats.lens_for(read, args.loaded, not args.skip_unembedding_check, args.translators)
        lens = lens.with_frozen_norm(frozen)
    else:
        lens = LogitLens(read, frozen_norm=frozen)
    prompt, source = sources.split(model, args.text, args.source)  # encoder-decoder: the target prefix's ids
    df = logit_lens.run(model, prompt, targets=args.target, positions=args.positions, every=args.every,
                        k=args.k, lens=lens, source=source)
    top = df[df["rank"] == 1]
    name = f"{df['lens'].iloc[0]} lens"
    if args.target is not None:
        lines = [f"{name} ({args.norm} final norm), target {top['target'].iloc[0]!r}:",
                 f"  {'pos':>4} {'site':<16} {'top token':<16} {'p(top)':>9} {'p(target)':>9} {'rank':>6}"]
    else:
        # Without --target each position has its own target (the model's final prediction there): show it.
        lines = [f"{name} ({args.norm} final norm), target: the model's top prediction at each position:",
                 f"  {'pos':>4} {'site':<16} {'top token':<16} {'p(top)':>9} {'target':<16} {'p(target)':>9} "
                 f"{'rank':>6}"]
    for _, row in top.iterrows():
        site = logit_lens.short_label(Site.parse(row["site"]))
        target = "" if args.target is not None else f" {row['target']!r:<16}"
        lines.append(f"  {row['pos']:>4} {site:<16} {row['token']!r:<16} {output.prob(row['prob'])}{target} "
                     f"{output.prob(row['target_prob'])} {row['target_rank']:>6}")
    if args.out is not None:
        table = tables.export(df, args.out)
        figure = report.write(_report(model, args, df, name), Path(args.out).with_suffix(".html"),
                              args.self_contained)
        lines.append(f"wrote {table} ({len(df)} rows) and {figure}")
    return "\n".join(lines + output.notes(df))


def _report(model, args, df, name: str):
    """The page beside the table: the heatmap, then the printed rows (each site's top token), and the notes."""
    import pandas as pd

    from resid.analyses import logit_lens, plots, report
    from resid.sites import Site

    top = df[df["rank"] == 1]
    rows = pd.DataFrame({
        "pos": top["pos"], "input": top["input"].map(repr),
        "site": [logit_lens.short_label(Site.parse(site)) for site in top["site"]],
        "top token": top["token"].map(repr), "p(top)": top["prob"], "target": top["target"].map(repr),
        "p(target)": top["target_prob"], "target rank": top["target_rank"]})
    target = (f"the target {top['target'].iloc[0]!r}" if args.target is not None
              else "the target (the model's own top prediction at that position)")
    measured = f"{name} ({args.norm} final norm), " + (f"target {top['target'].iloc[0]!r}" if args.target is not None
                                                        else "target: the model's top prediction at each position")
    parts = [plots.logit_lens_heatmap(df),
             f"Each row is one site (the residual stream after a layer, or between its sublayers) at one position: "
             f"the {name}'s top token there and its probability, and the probability and rank of {target}.",
             report.Table(rows, rows=40, full=Path(args.out).name, formats={"p(top)": "{:.3g}", "p(target)": "{:.3g}"}),
             *[note.removeprefix("note: ") for note in output.notes(df)]]
    return report.Page(f"resid lens: {args.text!r}", report.context(model, measured, [args.text]),
                       [report.Section(name.capitalize(), parts)])

