"""`resid ablate --prompts x.jsonl --out results.parquet`: a crash-safe ablation sweep plus its figure."""

from pathlib import Path

from resid.errors import ResidError


def add_parser(commands, common) -> None:
    ablate = commands.add_parser("ablate", parents=[common], help="ablation sweep over prompts (crash-safe)")
    ablate.add_argument("--prompts", required=True, help='JSONL: {"prompt": ..., "target": ..., "baseline": ...}')
    ablate.add_argument("--sites", default="sublayers", choices=["layers", "sublayers", "heads"])
    ablate.add_argument("--method", default="zero", choices=["zero", "mean", "resample"])
    ablate.add_argument("--reference", default=None, help="mean: text file (one text per line); resample: unused")
    ablate.add_argument("--mean-positions", default="agnostic", choices=["agnostic", "per_position"])
    ablate.add_argument("--metric", default=None, choices=["logit_diff", "logit", "target_prob", "loss"])
    ablate.add_argument("--batch-size", default="auto", help="rows per forward pass, or auto")
    ablate.add_argument("--seed", type=int, default=0)
    ablate.add_argument("--out", required=True, help="results file, .parquet or .csv (re-running resumes)")
    ablate.add_argument("--figure", default=None, help="HTML figure of the effect per layer (default: OUT.html)")
    ablate.add_argument("--quiet", action="store_true", help="no progress bar")


def run(model, args) -> str:
    from analyses import ablation, plots
    from analyses.io.prompts_file import read_jsonl

    batch_size = args.batch_size if args.batch_size == "auto" else positive_int(args.batch_size, "--batch-size")
    prompt_set = read_jsonl(args.prompts)
    df = ablation.sweep(
        model, prompt_set.prompts, prompt_set.targets, prompt_set.baselines, sites=args.sites,
        method=args.method, reference=args.reference, metric=args.metric, batch_size=batch_size,
        out=args.out, seed=args.seed, mean_positions=args.mean_positions, progress=not args.quiet,
    )
    figure = plots.save_html(plots.ablation_effects(df), args.figure or Path(args.out).with_suffix(".html"))
    top = df.groupby("site", sort=False)["delta"].mean().sort_values(key=abs, ascending=False).head(10)
    lines = [f"{len(df)} rows ({len(prompt_set.prompts)} prompts) -> {args.out}; figure -> {figure}",
             f"largest mean effects on {df['metric'].iloc[0]}:"]
    lines += [f"  {site:<28} {delta:+.4f}" for site, delta in top.items()]
    return "\n".join(lines)


def positive_int(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ResidError(f"{flag} must be a positive integer or 'auto', got {text!r}.")
    return int(text)
