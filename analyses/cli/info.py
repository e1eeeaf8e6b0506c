"""`resid info`: the model's config, weight files and tokenizer."""


def add_parser(commands, common) -> None:
    commands.add_parser("info", parents=[common], help="print the model's config")


def check(args) -> None:
    """Only the common options, which need the model to be checked."""


def run(model, args) -> str:
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    lines = [f"model: {model.name}", f"weights: {', '.join(str(f) for f in model.weight_files) or '-'}"]
    lines.append(f"parameters: {n_params:,}   dtype: {model.dtype}   device: {model.device}")
    for field, value in model.config.to_dict().items():
        lines.append(f"  {field:<18} {value}")
    tok = model.tokenizer
    if tok is not None:
        lines.append(f"tokenizer: vocab {tok.vocab_size}, bos {tok.bos_token_id}, prepend_bos {tok.prepend_bos}")
    return "\n".join(lines)
