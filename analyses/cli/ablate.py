"""`resid ablate --prompts x.jsonl --out results.parquet`: a crash-safe ablation sweep plus its figure."""

from pathlib import Path

from resid.analyses.cli import arguments, sources
from resid.errors import ResidError


def add_parser(commands, common) -> None:
    ablate = commands.add_parser("ablate", parents=[common], help="ablation sweep over prompts (crash-safe)")
    ablate.add_argument("--prompts", required=True, help='JSONL: {"prompt": ..., "target": ..., "baseline": ...}')
    ablate.add_argument("--sites", default="sublayer", choices=["layer", "sublayer", "head", "expert"],
                        help="ablate whole layers, each attention / MLP write (default), each head, or each "
                        "expert of a mixture-of-experts MLP")
    ablate.add_argument("--method", default="zero", choices=["zero", "mean", "resample"])
    ablate.add_argument("--reference", default=None,
                        help="mean: the texts to average each write over; resample: one donor prompt per prompt, in "
                        "order (default: a random prompt of the same length). A .txt (paragraphs, or one text per line "
                        "when it has no blank line) or .jsonl {\"text\": ...} file")
    ablate.add_argument("--mean-positions", default="agnostic", choices=["agnostic", "per_position"])
    ablate.add_argument("--metric", default=None, choices=["logit_diff", "logit", "target_prob", "loss"])
    ablate.add_argument("--batch-size", default="auto", help="rows per forward pass, or auto")
    ablate.add_argument("--seed", type=int, default=0)
    ablate.add_argument("--out", required=True, help="a file (.parquet .csv): the results (re-running resumes)")
    ablate.add_argument("--figure", default=None, help="a file (.html): the effect per layer (default: OUT.html)")
    sources.add(ablate)
    arguments.self_contained(ablate)
    arguments.executor_options(ablate)
    arguments.quiet(ablate)


def check(args) -> None:
    """Also reads --prompts (a bad line is reported before the model loads) into `args.prompt_set`; --ray and
--workers become `args.executor` (None: in process)."""
    from resid.analyses.io import suffixes
    from resid.analyses.io.prompts_file import read_jsonl

    args.batch_size = arguments.batch_size(args.batch_size)  # 'auto' or an int from here on
    arguments.out_path(args.out, suffixes.STORE)
    arguments.out_path(args.figure, (".html",), "--figure")
    if args.method == "mean" and args.reference is None and args.source is None:  # encoder-decoder: over the pairs
        raise ResidError("--method mean needs --reference FILE (.txt or .jsonl texts) to average each write over.")
    if args.method == "zero" and args.reference is not None:
        raise ResidError("--reference is not used by --method zero; drop it, or choose --method mean or resample.")
    if args.reference is not None:
        arguments.existing_file(args.reference, "--reference")
    args.prompt_set = read_jsonl(args.prompts)
    args.prompt_set.require_targets("resid ablate")
    args.source_texts = sources.read(args.source, len(args.prompt_set.prompts))
    if args.metric == "logit_diff" and args.prompt_set.baselines is None:
        raise ResidError(f'--metric logit_diff needs a "baseline" on every line of {args.prompts}; '
                         "or use --metric logit, target_prob or loss.")
    args.executor = arguments.executor(args.ray, args.workers)


def run(model, args) -> str:
    from resid.analyses import ablation, report

    prompt_set = args.prompt_set
    try:
        df = ablation.sweep(
            model, prompt_set.prompts, prompt_set.targets, prompt_set.baselines, sites=args.sites,
            method=args.method, reference=args.reference, metric=args.metric, seed=args.seed,
            mean_positions=args.mean_positions, source=args.source_texts,
            execution=arguments.execution(args.batch_size, args.quiet, args.executor, out=args.out),
        )
    finally:
        if args.executor is not None:
            args.executor.close()
    ranked = _ranked(df)
    figure = report.write(_report(model, args, df, ranked), args.figure or Path(args.out).with_suffix(".html"),
                          args.self_contained)
    top = ranked.head(10)
    lines = [f"{len(df)} rows ({len(prompt_set.prompts)} prompts) -> {args.out}; figure -> {figure}",
             f"largest mean effects on {df['metric'].iloc[0]}:"]
    lines += [f"  {site:<28} {delta:+.4f}" for site, delta in zip(top["site"], top["mean delta"])]
    return "\n".join(lines)


def _ranked(df):
    """Every ablated site's mean delta over the prompts (and its standard error), largest |mean| first."""
    stats = df.groupby("site", sort=False)["delta"].agg(["mean", "sem", "count"])
    stats = stats.reindex(stats["mean"].abs().sort_values(ascending=False).index)
    return stats.reset_index().rename(columns={"mean": "mean delta", "sem": "standard error", "count": "prompts"})


def _report(model, args, df, ranked):
    """The page the figure is written as: the effect per layer, then the sites with the largest mean effects."""
    from resid.analyses import plots, report

    metric, method, prompts = df["metric"].iloc[0], df["method"].iloc[0], df["prompt_idx"].nunique()
    row = (f"Each row is one ablated site ({args.sites}): the mean over the {prompts} prompts of its delta, the "
           f"{method}-ablated run's {metric} minus the clean run's, with its standard error; largest |mean| first.")
    parts = [plots.ablation_effects(df), row,
             report.Table(ranked, signed=("mean delta",), full=Path(args.out).name)]
    measured = f"{metric} under {method} ablation of each {args.sites} over {prompts} prompts"
    return report.Page(f"resid ablate: {method} ablation of each {args.sites}",
                       report.context(model, measured, args.prompt_set.prompts),
                       [report.Section(f"{method.capitalize()}-ablation effects on {metric}", parts)])

