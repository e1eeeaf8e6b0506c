"""`--source`, the source text(s) an encoder-decoder model's encoder reads (Marian, T5, the original Transformer,
loaded as resid.EncoderDecoder); the positional prompt is then the decoder's target prefix.

One prediction (predict, decompose, attribute, lens): `add_source` / `split`. The target prefix starts with the
decoder start token (config.json's decoder_start_token_id, as in Hugging Face's generate; Marian's is its pad
token), so an empty prompt ("") asks for the first target token. A decoder-only model takes no --source.

Sweeps (resid ablate, resid patch): `add` / `read`. A text is every prompt's source; a file (.txt: one source per
line, or per paragraph when it has blank lines; .jsonl: {"text": ...} per line) gives one source per prompt, in order.
"""

from pathlib import Path

from resid.errors import ResidError


def add(parser, flag: str = "--source", what: str = "each prompt's source") -> None:
    parser.add_argument(flag, default=None, help=f"encoder-decoder models (Marian): {what}, a text (the same for "
                        "every prompt) or a .txt / .jsonl file with one source per prompt, in order")


def read(value: str | None, n: int, flag: str = "--source") -> list[str] | None:
    """The sources of `n` prompts (None without the flag); a file's count must be n."""
    if value is None:
        return None
    from resid.analyses.io import texts

    if not Path(value).is_file():
        if Path(value).suffix.lower() in texts.SUFFIXES:
            raise ResidError(f"{flag} {value}: no such file. Give an existing .txt / .jsonl file, or the source text.")
        return [value] * n
    found = texts.read(value, flag.removeprefix("--"))
    if len(found) != n:
        raise ResidError(f"{flag} {value} holds {len(found)} sources for {n} prompts: give one source per prompt, "
                         "in order (one per line).")
    return found


def add_source(parser) -> None:
    parser.add_argument("--source", default=None,
                        help="encoder-decoder models (Marian): the source text the encoder reads; the prompt is then "
                             "the decoder's target prefix (\"\" for the first target token)")


def split(model, text: str, source: str | None):
    """(the decoder-side prompt as the analyses take it, the source= they take): for a decoder-only model the text
    itself and None; for an encoder-decoder model the target prefix's ids [1 pos], decoder start token first, and
    the source's ids [1 pos]. Either model with the wrong --source gets one error."""
    from resid.seq2seq import EncoderDecoder

    if not isinstance(model, EncoderDecoder):
        if source is not None:
            raise ResidError(f"--source is for encoder-decoder models (Marian); {model.name} is decoder-only: drop "
                             "--source and give the whole prompt.")
        return text, None
    if source is None:
        raise ResidError(f"{model.name} is an encoder-decoder model: give the text to translate with --source TEXT; "
                         "the prompt is then the decoder's target prefix (\"\" for the first target token).")
    # the target prefix as generate takes a text target: the decoder start token (config.json's), then its tokens
    return model.target_tokens(text, 1).ids.to(model.device), source_ids(model, source)


def source_ids(model, source: str):
    """The encoder's tokens for a source text, ended by </s> as Marian's tokenizer ends every source."""
    import torch

    tok = model.tokenizer
    if tok is None:
        raise ResidError(f"{model.name} has no tokenizer.json next to its weights: --source cannot be tokenized.")
    ids = tok.encode(source, prepend_bos=False)
    if tok.eos_token_id is not None and (not ids or ids[-1] != tok.eos_token_id):
        ids = [*ids, tok.eos_token_id]
    return torch.tensor([ids], device=model.device)


def pieces(model, prompt) -> list[str]:
    """The prompt's tokens as printed: the text's pieces, or each id decoded (the decoder start token included)."""
    if isinstance(prompt, str):
        return model.to_str_tokens(prompt)
    return [model.tokenizer.decode([i]) for i in prompt[0].tolist()]


def shown(model, source) -> str:
    """The source as the header line shows it after the prompt ("" for a decoder-only model)."""
    return "" if source is None else f"   source: {len(source[0])} tokens {pieces(model, source)}"


def last_logits(model, prompt, source):
    """The next-token logits [d_vocab] after the prompt (the decoder's, reading the source, for an encoder-decoder
    model), nothing recorded."""
    from resid.capture import Capture

    if source is None:
        return model.run(prompt, capture=Capture.none(), logits_at="last").logits[0, 0]
    return model.run(source, prompt, capture=Capture.none(), logits_at="last").logits[0, 0]
