"""`resid lens eval --translators DIR --jlens DIR`: the logit lens, a tuned lens and a J-lens site by site on
held-out text (resid.analyses.lenses.evaluation): KL to the final distribution, cross-entropy, entropy, top-1
agreement.

    resid lens eval --translators smollm2-lens --tokens 4096 --out eval.md     # + eval.md.json, eval.html
    resid lens eval --lens jacobian --jlens smollm2-jlens                      # the logit lens and the J-lens

Held-out text: the paragraphs `resid lens train` left out with the same --corpus, --max-docs and --held-out.
"""

import sys
from pathlib import Path

from resid.analyses.cli import arguments
from resid.analyses.cli.lens_data import corpus_options, held_out_split


def add_parser(commands, common) -> None:
    parser = commands.add_parser("lens eval", parents=[common],
                                 help="logit vs tuned vs Jacobian lens per layer on held-out text")
    parser.add_argument("--translators", default=None, help="a tuned lens's folder (resid's or tuned-lens's "
                        "layout); without it or --jlens only the logit lens is evaluated")
    parser.add_argument("--jlens", default=None, help="a J-lens: the folder `resid lens fit-jacobian` wrote, or the "
                        "reference's .pt file (TransformerLens 4.3, Neuronpedia)")
    parser.add_argument("--lens", default=None, choices=["tuned", "jacobian"], action="append",
                        help="which lenses beside the logit lens (default: those whose files are given); "
                        "--lens jacobian needs --jlens, --lens tuned needs --translators")
    corpus_options(parser)
    parser.add_argument("--tokens", type=int, default=4096, help="held-out tokens evaluated (default 4096)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per window (default 512)")
    parser.add_argument("--every", default=None, choices=["layer", "sublayer"],
                        help="sites read: after every layer or every sublayer (default: the lens's, else layer)")
    parser.add_argument("--batch-size", type=int, default=None, help="windows per forward pass")
    parser.add_argument("--out", default=None, help="a file (.csv .parquet .tex .md): the table; the figure (.html) "
                        "goes beside it")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    arguments.self_contained(parser)


def check(args) -> None:
    from resid.analyses.io import suffixes

    arguments.at_least(args.tokens, 1, "--tokens")
    arguments.at_least(args.seq_len, 2, "--seq-len")
    arguments.out_path(args.out, suffixes.TABLE)
    windows = max(1, args.tokens // args.seq_len)
    if windows * args.seq_len != args.tokens:  # said before it starts, not found in the table afterwards
        count = f"{windows} whole window{'s' if windows > 1 else ''}"
        print(f"resid: evaluating {windows * args.seq_len:,} tokens: {count} "
              f"of --seq-len {args.seq_len} (--tokens {args.tokens} is not a multiple of it; a shorter window would "
              "change what every position sees)", file=sys.stderr)
    from resid.errors import ResidError

    wanted = set(args.lens or [])
    for kind, flag, given in (("tuned", "--translators", args.translators), ("jacobian", "--jlens", args.jlens)):
        if kind in wanted and not given:
            raise ResidError(f"--lens {kind} needs {flag}: the folder the lens was written to.")
        if args.lens and given and kind not in wanted:
            raise ResidError(f"{flag} is given but --lens does not name {kind}: add --lens {kind}, or drop {flag}.")
    args.loaded = None
    if args.translators:
        from resid.analyses.lenses import formats

        args.loaded = formats.read_translators(args.translators)  # before the model loads: a bad folder costs nothing
    if args.jlens:
        from resid.analyses.lenses import formats

        if not formats.is_jacobian(Path(args.jlens)):
            raise ResidError(f"--jlens {args.jlens}: no J-lens there (a folder with {formats.JLENS_FILE}, or the "
                             "reference's .pt file). Fit one with `resid lens fit-jacobian --out DIR`.")
    held_out_split(args)


def run(model, args) -> str:
    from resid.analyses import plots, tables, tuned_lens
    from resid.analyses.distributed.execution import Execution
    from resid.analyses.lenses import formats

    _, held_out = args.split(model)
    lenses = [] if args.loaded is None else [tuned_lens.TunedLens(model, args.loaded)]
    if args.jlens:
        lenses.append(formats.read_jacobian(model, args.jlens))
    every = args.every or (args.loaded.every if args.loaded is not None else "layer")
    execution = Execution(batch_size=args.batch_size or "auto", progress=False if args.quiet else None)
    df = tuned_lens.evaluate(model, held_out, lenses, every=every, seq_len=args.seq_len, max_tokens=args.tokens,
                             execution=execution)
    lines = [f"lenses on {df['tokens'].iloc[0]:,} held-out tokens (nats; top1: agreement with the model's top token)",
             table(df)]
    if args.out is not None:
        written = tables.export(df, args.out)
        figure = plots.save_html(tuned_lens.figure(df), Path(args.out).with_suffix(".html"),
                                 self_contained=args.self_contained)
        lines.append(f"wrote {written} ({len(df)} rows) and {figure}")
    return "\n".join(lines)


def table(df) -> str:
    """One line per site: each lens's KL, cross-entropy, entropy and top-1 agreement side by side."""
    names = list(dict.fromkeys(df["lens"]))
    head = f"  {'site':<9}" + "".join(f" | {name + ' KL':>9} {'CE':>6} {'H':>6} {'top1':>5}" for name in names)
    lines = [head]
    for label, rows in df.groupby("label", sort=False):
        by = rows.set_index("lens")
        kl = {n: max(by.at[n, "kl"], 0.0) for n in names}  # at the last site float rounding can give -1e-9
        lines.append(f"  {label:<9}" + "".join(
            f" | {kl[n]:9.3f} {by.at[n, 'ce']:6.3f} {by.at[n, 'entropy']:6.3f} {by.at[n, 'top1']:5.3f}"
            for n in names))
    return "\n".join(lines)
