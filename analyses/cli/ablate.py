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
    arguments.not_being_written(args.out)
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
    from resid.analyses import ablation, plots

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
    figure = plots.save_html(plots.ablation_effects(df), args.figure or Path(args.out).with_suffix(".html"),
                             self_contained=args.self_contained)
    top = df.groupby("site", sort=False)["delta"].mean().sort_values(key=abs, ascending=False).head(10)
    lines = [f"{len(df)} rows ({len(prompt_set.prompts)} prompts) -> {args.out}; figure -> {figure}",
             f"largest mean effects on {df['metric'].iloc[0]}:"]
    lines += [f"  {site:<28} {delta:+.4f}" for site, delta in top.items()]
    return "\n".join(lines)

