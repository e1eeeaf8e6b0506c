"""`resid info`: the model's config, weight files and tokenizer (an encoder-decoder model's two stacks, each its
own config)."""


def add_parser(commands, common) -> None:
    commands.add_parser("info", parents=[common], help="print the model's config")


def check(args) -> None:
    """Only the common options, which need the model to be checked."""


def run(model, args) -> str:
    decoder = getattr(model, "decoder", model)  # an EncoderDecoder's dtype and device are its decoder's
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    lines = [f"model: {model.name}", f"weights: {', '.join(str(f) for f in model.weight_files) or '-'}"]
    lines.append(f"parameters: {n_params:,}   dtype: {decoder.dtype}   device: {model.device}")
    stacks = [("encoder", model.encoder), ("decoder", decoder)] if decoder is not model else [(None, model)]
    for stack, part in stacks:
        if stack is not None:
            lines.append(f"{stack} (reads {'the source' if stack == 'encoder' else 'the target prefix + the source'}):")
        for field, value in part.config.to_dict().items():
            lines.append(f"  {field:<18} {value}")
    tok = model.tokenizer
    if tok is not None:
        lines.append(f"tokenizer: vocab {tok.vocab_size}, bos {tok.bos_token_id}, prepend_bos {tok.prepend_bos}")
    if decoder is not model:
        lines.append("encoder-decoder: the commands take --source TEXT; the prompt is the decoder's target prefix")
    return "\n".join(lines)
