"""The `resid` command.

    resid predict "The Eiffel Tower is located in the city of" [--model M] [--top K]
    resid info [--model M]
    resid ablate --prompts prompts.jsonl [--sites sublayers] [--method mean --reference corpus.txt]
                 --out results.parquet [--figure effects.html]

Bad input ends in one line `resid: error: ...` and exit status 2, never a traceback.
"""

import argparse
import sys
from collections.abc import Sequence

import torch

from resid.errors import ResidError

DEFAULT_MODEL = "smollm2-135m"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="resid", description="Residual-stream interpretability toolkit.")
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default=DEFAULT_MODEL, help="resid name, folder, .gguf file or Hub id")
    common.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    common.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    predict = commands.add_parser("predict", parents=[common], help="top next tokens with probabilities")
    predict.add_argument("text")
    predict.add_argument("--top", type=int, default=10, help="how many tokens to list (default 10)")
    commands.add_parser("info", parents=[common], help="print the model's config")
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
    return parser


def ablate(model, args) -> str:
    from pathlib import Path

    from analyses import ablation, plots
    from analyses.prompts_file import read_jsonl

    batch_size = args.batch_size if args.batch_size == "auto" else _positive_int(args.batch_size, "--batch-size")
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


def _positive_int(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ResidError(f"{flag} must be a positive integer or 'auto', got {text!r}.")
    return int(text)


def predict(model, text: str, top: int) -> str:
    if top < 1:
        raise ResidError(f"--top must be at least 1, got {top}.")
    run = model.run(text, capture=_no_capture())
    last = run.tokens.last_positions()[0]
    probs = torch.softmax(run.logits[0, last].float(), dim=-1)
    values, ids = probs.topk(min(top, probs.shape[-1]))
    pieces = model.to_str_tokens(text)
    lines = [f"model: {model.name}   prompt: {len(pieces)} tokens {pieces}", "rank  prob     id      token"]
    for rank, (p, i) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
        lines.append(f"{rank:>4}  {p:7.4f}  {i:>6}  {model.tokenizer.decode([i])!r}")
    return "\n".join(lines)


def info(model) -> str:
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    lines = [f"model: {model.name}", f"weights: {', '.join(str(f) for f in model.weight_files) or '-'}"]
    lines.append(f"parameters: {n_params:,}   dtype: {model.dtype}   device: {model.device}")
    for field, value in model.config.to_dict().items():
        lines.append(f"  {field:<18} {value}")
    tok = model.tokenizer
    if tok is not None:
        lines.append(f"tokenizer: vocab {tok.vocab_size}, bos {tok.bos_token_id}, prepend_bos {tok.prepend_bos}")
    return "\n".join(lines)


def _no_capture():
    from resid.capture import Capture

    return Capture.none()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from resid.load import load

        model = load(args.model, device=args.device, dtype=args.dtype)
        if args.command == "predict":
            print(predict(model, args.text, args.top))
        elif args.command == "info":
            print(info(model))
        elif args.command == "ablate":
            print(ablate(model, args))
    except ResidError as err:
        print(f"resid: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
