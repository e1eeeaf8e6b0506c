"""`resid attribute`: direct attribution for one prompt or a JSONL prompt set, written as a table.

    resid attribute "When Mary and John went to the store, John gave a drink to" --target " Mary" --baseline " John"
    resid attribute --prompts ioi.jsonl --level head --out heads.parquet      # .csv .parquet .tex .md
"""

from resid.analyses.cli import arguments, output, sources
from resid.errors import ResidError


def add_parser(commands, common) -> None:
    parser = commands.add_parser("attribute", parents=[common], help="direct attribution table (scripts)")
    parser.add_argument("text", nargs="?", default=None, help="one prompt (or use --prompts)")
    parser.add_argument("--prompts", default=None, help='JSONL: {"prompt": ..., "target": ..., "baseline": ...}; '
                        'target optional '
                        "(default: that prompt's top prediction)")
    parser.add_argument("--target", default=None, help="target token (default: each prompt's top prediction)")
    parser.add_argument("--baseline", default=None, help="attribute logit(target) - logit(baseline)")
    parser.add_argument("--level", default="head", choices=["sublayer", "head", "neuron"])
    parser.add_argument("--pos", type=int, default=-1, help="prompt position to attribute (default -1, the last)")
    parser.add_argument("--top", type=int, default=10, help="components listed per prompt (default 10)")
    parser.add_argument("--out", default=None, help="a file (.csv .parquet .tex .md): the table, "
                        "plus a .json provenance sidecar")
    sources.add_source(parser)


def check(args) -> None:
    """Also reads --prompts (a bad line is reported before the model loads) into `args.prompt_set`."""
    from resid.analyses.io import suffixes
    from resid.analyses.io.prompts_file import read_jsonl

    if (args.text is None) == (args.prompts is None):
        raise ResidError("Give either one prompt or --prompts FILE.jsonl (not both).")
    if args.prompts is not None and (args.target is not None or args.baseline is not None):
        raise ResidError("With --prompts, targets and baselines come from the JSONL file, not --target.")
    if args.prompts is not None and args.source is not None:
        raise ResidError("--source goes with one prompt (the target prefix), not with --prompts.")
    arguments.at_least(args.top, 1, "--top")
    arguments.out_path(args.out, suffixes.TABLE)
    args.prompt_set = read_jsonl(args.prompts) if args.prompts is not None else None


def run(model, args) -> str:
    from resid.analyses import attribution, tables

    if args.prompt_set is not None:
        prompts, target, baseline = args.prompt_set.prompts, args.prompt_set.targets, args.prompt_set.baselines
    else:
        prompts, target, baseline = [args.text], args.target, args.baseline
    source = None
    if args.prompt_set is None:
        prompts, source = sources.split(model, args.text, args.source)  # encoder-decoder: the target prefix's ids
    elif hasattr(model, "decoder"):
        raise ResidError(f"{model.name} is an encoder-decoder model: attribute one target prefix with --source TEXT "
                         "(--prompts files carry no sources yet).")
    df = attribution.direct(model, prompts, target, baseline, level=args.level, position=args.pos, source=source)
    lines = []
    for prompt_idx, rows in df.groupby("prompt_idx", sort=True):
        lines.append(f"prompt {prompt_idx}: {attribution.metric_name(rows)} = {rows['logit'].iloc[0]:.4f} "
                     f"(sum of {len(rows)} components {rows['value'].sum():.4f})")
        ranked = attribution.top_components(rows, args.top)
        lines += [f"  {value:+9.4f}  {component}" for value, component in zip(ranked["value"], ranked["site"])]
    if args.out is not None:
        lines.append(f"wrote {tables.export(df, args.out)} ({len(df)} rows)")
    return "\n".join(lines + output.notes(df))
