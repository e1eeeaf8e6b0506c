"""`resid predict "text" [--top K]`: the top next tokens with probabilities."""

import torch

from analyses.cli import arguments
from resid.capture import Capture


def add_parser(commands, common) -> None:
    parser = commands.add_parser("predict", parents=[common], help="top next tokens with probabilities")
    parser.add_argument("text", help="the prompt whose next token is predicted")
    parser.add_argument("--top", type=int, default=10, help="how many tokens to list (default 10)")


def check(args) -> None:
    arguments.at_least(args.top, 1, "--top")


def run(model, args) -> str:
    text, top = args.text, args.top
    result = model.run(text, capture=Capture.none(), logits_at="last")
    probs = torch.softmax(result.logits[0, 0].float(), dim=-1)
    values, ids = probs.topk(min(top, probs.shape[-1]))
    pieces = model.to_str_tokens(text)
    lines = [f"model: {model.name}   prompt: {len(pieces)} tokens {pieces}", "rank  prob     id      token"]
    for rank, (p, i) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
        lines.append(f"{rank:>4}  {p:7.4f}  {i:>6}  {model.tokenizer.decode([i])!r}")
    return "\n".join(lines)
