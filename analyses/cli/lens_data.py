"""The corpus options that `resid lens train` and `resid lens eval` share, so that eval holds out exactly the
paragraphs train left out: the same --corpus, --max-docs and --held-out give the same split."""

from resid.analyses.cli import arguments
from resid.errors import ResidError


def corpus_options(parser) -> None:
    parser.add_argument("--corpus", default=None, help=".txt (blank-line paragraphs) or .jsonl {'text': ...}; "
                        "default: the demo corpus (State of the Union addresses, 1946 on)")
    parser.add_argument("--max-docs", type=int, default=None, help="documents read from the corpus (default: all)")
    parser.add_argument("--held-out", type=float, default=0.1,
                        help="fraction of the paragraphs held out for evaluation, by a hash of their text "
                        "(default 0.1)")


def held_out_split(args) -> None:
    """Checks the corpus options and sets `args.split(model) -> (training, held_out)` documents."""
    from resid.analyses import corpus
    from resid.analyses.lenses import data

    if args.max_docs is not None:
        arguments.at_least(args.max_docs, 1, "--max-docs")
    if not 0 < args.held_out < 1:
        raise ResidError(f"--held-out must be a fraction between 0 and 1, got {args.held_out}.")
    texts = corpus.load(args.corpus) if args.corpus else None  # a bad file fails before the model loads
    if texts is not None and args.max_docs is not None:
        texts = texts[: args.max_docs]

    def split(model):
        documents = texts if texts is not None else corpus.demo(max_documents=args.max_docs)
        return data.split(documents, args.held_out)

    args.split = split
