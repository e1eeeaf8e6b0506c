"""The `resid` command.

    resid predict "The Eiffel Tower is located in the city of" [--model M] [--top K]
    resid info [--model M]

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
    return parser


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
    except ResidError as err:
        print(f"resid: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
