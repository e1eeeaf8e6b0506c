"""`resid predict "text" [--top K] [--target T]`: the top next tokens with probabilities, and where a target
stands among them (TransformerLens's `test_prompt`)."""

from resid.analyses.cli import arguments, sources
from resid.errors import ResidError


def add_parser(commands, common) -> None:
    parser = commands.add_parser("predict", parents=[common], help="top next tokens with probabilities")
    parser.add_argument("text", help="the prompt whose next token is predicted")
    parser.add_argument("--top", type=int, default=10, help="how many tokens to list (default 10)")
    parser.add_argument("--target", default=None, help="also print this token's rank, probability and logit, "
                        "e.g. ' Mary' (one token)")
    sources.add_source(parser)


def check(args) -> None:
    arguments.at_least(args.top, 1, "--top")


def run(model, args) -> str:
    import torch

    from resid.analyses.vocab import single_token_id

    top = args.top
    if getattr(model, "config", None) is not None and model.config.head == "none":
        raise ResidError(f"resid predict lists a language model's next tokens, but {model.name} is an embedding "
                         "model (no LM head, no logits). Pass a language model (--model smollm2-135m), or read its "
                         "embeddings in Python: model.run(text).hidden.")
    prompt, source = sources.split(model, args.text, args.source)
    # Before the forward pass: a multi-token target is reported without running the model.
    target_id = None if args.target is None else single_token_id(getattr(model, "decoder", model), args.target)
    logits = sources.last_logits(model, prompt, source).float()
    probs = torch.softmax(logits, dim=-1)
    values, ids = probs.topk(min(top, probs.shape[-1]))
    pieces = sources.pieces(model, prompt)
    header = f"model: {model.name}   prompt: {len(pieces)} tokens {pieces}" + sources.shown(model, source)
    lines = [header, "rank  prob     id      token"]
    for rank, (p, i) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
        lines.append(f"{rank:>4}  {p:7.4f}  {i:>6}  {model.tokenizer.decode([i])!r}")
    if target_id is not None:
        # Rank 1 = the top token; ties count in the target's favour, as in the lens's target_rank.
        rank = int((logits > logits[target_id]).sum()) + 1
        lines.append(f"target {model.tokenizer.decode([target_id])!r} (id {target_id}): rank {rank}, "
                     f"prob {probs[target_id].item():.3g}, logit {logits[target_id].item():.4f}")
    return "\n".join(lines)
