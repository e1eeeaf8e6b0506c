"""`resid predict "text" [--top K]`: the top next tokens with probabilities."""

import torch

from resid.capture import Capture
from resid.errors import ResidError


def add_parser(commands, common) -> None:
    parser = commands.add_parser("predict", parents=[common], help="top next tokens with probabilities")
    parser.add_argument("text")
    parser.add_argument("--top", type=int, default=10, help="how many tokens to list (default 10)")


def run(model, args) -> str:
    text, top = args.text, args.top
    if top < 1:
        raise ResidError(f"--top must be at least 1, got {top}.")
    result = model.run(text, capture=Capture.none(), logits_at="last")
    probs = torch.softmax(result.logits[0, 0].float(), dim=-1)
    values, ids = probs.topk(min(top, probs.shape[-1]))
    pieces = model.to_str_tokens(text)
    lines = [f"model: {model.name}   prompt: {len(pieces)} tokens {pieces}", "rank  prob     id      token"]
    for rank, (p, i) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
        lines.append(f"{rank:>4}  {p:7.4f}  {i:>6}  {model.tokenizer.decode([i])!r}")
    return "\n".join(lines)
