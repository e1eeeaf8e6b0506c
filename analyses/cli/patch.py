"""`resid patch --pairs pairs.jsonl --out results.parquet`: activation patching (exact) or attribution patching
(AtP, AtP*) of (clean, corrupt) prompt pairs, plus a heatmap: layer x position for the residual stream, layer x
head for heads (and their inputs), a line per part for sublayers. pairs.jsonl has one {"clean": ..., "corrupt": ...,
"target": ..., "baseline": ...} object per line (baseline optional; the two prompts of a pair have the same token
length)."""

from pathlib import Path

from resid.analyses.cli import arguments, sources
from resid.analyses.io import suffixes
from resid.errors import ResidError

EXAMPLE = '{"clean": "When Mary and John went to the store, John gave a drink to", "corrupt": "When Mary and John ' \
          'went to the store, Mary gave a drink to", "target": " Mary", "baseline": " John"}'


def add_parser(commands, common) -> None:
    patch = commands.add_parser("patch", parents=[common], help="activation / attribution patching of prompt pairs")
    patch.add_argument("--pairs", required=True, help='JSONL: {"clean": ..., "corrupt": ..., "target": ..., '
                       '"baseline": ...}')
    patch.add_argument("--sites", default="resid_pre", choices=["resid_pre", "resid_mid", "resid_post", "layer",
                                                                "sublayer", "head", "q", "k", "v", "pattern"],
                       help="the residual stream by layer and position (default resid_pre; resid_mid, resid_post: "
                       "exact only), each layer (exact only), each attention / MLP write, each head, or each head's "
                       "query, key, value or attention pattern")
    patch.add_argument("--method", default="exact", choices=["exact", "atp", "atp*"],
                       help="exact activation patching (one patched run per site), AtP (one backward pass), or AtP* "
                       "(queries and keys through the exact new pattern, and GradDrop: one backward pass per layer)")
    patch.add_argument("--direction", default="denoise", choices=["denoise", "noise"],
                       help="denoise: patch clean activations into the corrupt run; noise: the reverse")
    patch.add_argument("--align", default=None, choices=["end"],
                       help="pairs of different token lengths: align them from the last token back (the "
                       "residual sites, and atp / atp*)")
    patch.add_argument("--metric", default=None, choices=["logit_diff", "logit", "target_prob", "loss"])
    patch.add_argument("--batch-size", default="auto", help="rows per forward pass, or auto")
    patch.add_argument("--out", required=True, help="a file (.parquet .csv): one row per (pair, site)")
    patch.add_argument("--figure", default=None, help="a file (.html): the heatmap (default: OUT.html)")
    sources.add(patch, what="each clean prompt's source")
    sources.add(patch, "--corrupt-source", "each corrupt prompt's source (default: --source)")
    arguments.self_contained(patch)
    arguments.executor_options(patch)
    arguments.quiet(patch)


def check(args) -> None:
    """Also reads --pairs (a bad line is reported before the model loads) into `args.pairs_read`."""
    from resid.analyses.io import prompts_file, texts

    args.batch_size = arguments.batch_size(args.batch_size)
    arguments.out_path(args.out, suffixes.STORE)
    arguments.out_path(args.figure, (".html",), "--figure")
    numbered = texts.records(args.pairs, {"clean": str, "corrupt": str, "target": object}, EXAMPLE, "pairs")
    prompts_file.check_tokens(args.pairs, numbered, example=EXAMPLE, required=("target",))
    found = [record for _, record in numbered]
    if not found:
        raise ResidError(f"{args.pairs} holds no pairs: give one {EXAMPLE} object per line.")
    with_baseline = [r.get("baseline") is not None for r in found]
    if any(with_baseline) and not all(with_baseline):
        raise ResidError(f"{args.pairs}: give every line a baseline, or none.")
    if args.metric == "logit_diff" and not all(with_baseline):
        raise ResidError(f'--metric logit_diff needs a "baseline" on every line of {args.pairs}.')
    if args.method != "exact" and args.sites in ("resid_mid", "resid_post", "layer"):
        raise ResidError(f"--sites {args.sites} is patched exactly only: use --method exact, or --sites resid_pre, "
                         f"sublayer, head, q, k, v or pattern with --method {args.method}.")
    args.pairs_read = found
    if args.corrupt_source is not None and args.source is None:
        raise ResidError("--corrupt-source goes with --source (the clean prompts' sources); give both, or neither.")
    args.source_texts = sources.read(args.source, len(found))
    args.corrupt_texts = sources.read(args.corrupt_source, len(found), "--corrupt-source")
    args.executor = arguments.executor(args.ray, args.workers)


def run(model, args) -> str:
    from resid.analyses import patching, report, tables

    found = args.pairs_read
    clean, corrupt = [r["clean"] for r in found], [r["corrupt"] for r in found]
    targets = [r["target"] for r in found]
    baselines = [r["baseline"] for r in found] if found[0].get("baseline") is not None else None
    # --out is the table written below, not a result store: the rows are exported once, in the table's columns
    execution = arguments.execution(args.batch_size, args.quiet, args.executor)
    pairs = patching.Pairs(clean, corrupt, targets, baselines, metric=args.metric, align=args.align)
    options = dict(sites=args.sites, direction=args.direction, source=args.source_texts,
                   corrupt_source=args.corrupt_texts, execution=execution)
    try:
        if args.method == "exact":
            df = patching.activation(model, pairs, **options)
        else:
            df = patching.atp(model, pairs, method=args.method, **options)
    finally:
        if args.executor is not None:
            args.executor.close()
    out = tables.export(df, args.out)
    ranked, explained = _ranked(df, args.direction)
    figure = report.write(_report(model, args, df, ranked, explained, clean),
                          args.figure or Path(args.out).with_suffix(".html"), args.self_contained)
    lines = [f"{len(df)} rows ({len(found)} pairs, {args.method}) -> {out}; figure -> {figure}"]
    top = ranked.head(10)
    if args.method == "atp*":
        lines.append(f"largest estimated effect sizes on {df['metric'].iloc[0]} (AtP* GradDrop, {args.direction}):")
        lines += [f"  {site:<32} {effect:+.4f}" for site, effect in zip(top["site"], top["magnitude"])]
        return "\n".join(lines)
    lines.append(f"largest mean effects on {df['metric'].iloc[0]} ({args.direction}): {explained}")
    lines += [f"  {site:<32} effect {effect:+.4f}   score {score:+.3f}"
              for site, effect, score in zip(top["site"], top["effect"], top["score"])]
    return "\n".join(lines)


def _ranked(df, direction: str):
    """Every site's mean over the pairs, largest first, and what its columns mean. AtP*'s GradDrop estimates sizes,
    not signs: its sites by `magnitude`. Otherwise by |effect|, the effect in the metric's units beside the table's
    score, the share of the clean - corrupt gap, both labelled so that neither is read as the other."""
    import pandas as pd

    from resid.analyses import patching

    if "magnitude" in df and (df["method"] == "atp*").all():
        sizes = df.groupby("site")["magnitude"].mean().sort_values(ascending=False)
        return pd.DataFrame({"site": sizes.index, "magnitude": sizes.values}), "magnitude = the estimated |effect|"
    effects = patching.site_effects(df).sort_values(key=abs, ascending=False)
    scores = df.groupby("site")["score"].mean()
    base = "corrupt" if direction == "denoise" else "clean"
    explained = (f"effect = patched - {base} run's metric; score = the table's score column, (patched - corrupt) / "
                 "(clean - corrupt): 0 at the corrupt run's metric, 1 at the clean run's")
    return pd.DataFrame({"site": effects.index, "effect": effects.values,
                         "score": scores[effects.index].values}), explained


def _report(model, args, df, ranked, explained: str, clean: list[str]):
    """The page the figure is written as: the heatmap, then the sites with the largest mean effects."""
    from resid.analyses import plots, report

    metric, pairs = df["metric"].iloc[0], df["prompt_idx"].nunique()
    what = {"exact": "Activation patching", "atp": "Attribution patching (AtP)",
            "atp*": "Attribution patching (AtP*)"}[args.method]
    row = (f"Each row is one patched site, over the {pairs} pairs: the mean estimated size of patching it ({explained},"
           " from AtP*'s GradDrop, which estimates sizes, not signs), largest first."
           if "magnitude" in ranked else
           f"Each row is one patched site, over the {pairs} pairs, largest |effect| first: {explained}.")
    measured = f"{metric}, {args.direction} patching of {args.sites} sites ({args.method}) over {pairs} pairs"
    parts = [plots.patching_heatmap(df), row,
             report.Table(ranked, signed=[c for c in ("effect", "score") if c in ranked],
                          full=Path(args.out).name)]
    return report.Page(f"resid patch: {what.lower()} of {pairs} pairs", report.context(model, measured, clean),
                       [report.Section(f"{what}, {args.direction}: {metric}", parts)])
