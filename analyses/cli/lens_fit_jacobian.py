"""`resid lens fit-jacobian --out DIR`: fit a Jacobian lens (resid.analyses.lenses.jacobian: the expected Jacobian of
the final residual with respect to each layer's, the estimator of Anthropic's reference and TransformerLens 4.3) on a
corpus, resumably, and write it into DIR.

    resid lens fit-jacobian --out smollm2-jlens --tokens 8192 --seq-len 128
    resid lens fit-jacobian --out jlens --corpus notes.txt --layout transformer-lens   # DIR/jacobian_lens.pt

The corpus is split as `resid lens train` splits it (the same --corpus, --max-docs, --held-out), and fitted on the
training part; `resid lens eval --jlens DIR` evaluates it on the held-out part. DIR gets checkpoint.safetensors every
--checkpoint-every batches (rerun the same command after a kill: it resumes) and jacobians.safetensors at the end.
"""

from resid.analyses.cli import arguments
from resid.analyses.cli.lens_data import corpus_options, held_out_split


def add_parser(commands, common) -> None:
    parser = commands.add_parser("lens fit-jacobian", parents=[common],
                                 help="fit a Jacobian lens (J-lens) on a corpus, resumably")
    parser.add_argument("--out", required=True, help="a folder: the checkpoint while fitting, then the lens")
    corpus_options(parser)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens fitted on (default 8192)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per window (default 128, the reference's)")
    parser.add_argument("--skip-first", type=int, default=16,
                        help="leading positions of a window left out of the average (default 16, the reference's)")
    parser.add_argument("--every", default="layer", choices=["layer", "sublayer"],
                        help="fit every layer's output (default), or also every resid_mid")
    parser.add_argument("--block", type=int, default=1, help="output dimensions per backward pass (default 1)")
    parser.add_argument("--layout", default="resid", choices=["resid", "transformer-lens"],
                        help="resid's jacobians.safetensors (default) or the reference's jacobian_lens.pt")
    parser.add_argument("--checkpoint-every", type=int, default=None, help="batches between checkpoints (default: "
                        "Execution's, every 4%% of the batches, at most 100)")
    parser.add_argument("--batch-size", type=int, default=None, help="windows per forward pass (default: 2048 "
                        "tokens' worth)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def check(args) -> None:
    arguments.out_folder(args.out)
    for flag in ("tokens", "seq_len", "block"):
        arguments.at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    if args.checkpoint_every is not None:
        arguments.at_least(args.checkpoint_every, 1, "--checkpoint-every")
    arguments.at_least(args.skip_first, 0, "--skip-first")
    if args.batch_size is not None:
        arguments.at_least(args.batch_size, 1, "--batch-size")
    held_out_split(args)


def run(model, args) -> str:
    from resid.analyses import lenses
    from resid.analyses.distributed.execution import Execution

    training, _ = args.split(model)
    execution = Execution(batch_size=args.batch_size or "auto", progress=False if args.quiet else None,
                          out=args.out, checkpoint_every=args.checkpoint_every)
    lens = lenses.fit_jacobian(model, training, every=args.every, seq_len=args.seq_len,
                               max_windows=max(1, args.tokens // args.seq_len), skip_first=args.skip_first,
                               block=args.block, execution=execution)
    folder = lenses.write(lens, args.out, layout=args.layout)
    return (f"fitted a J-lens of {model.name}: {len(lens.sites)} sites (every {args.every}) on "
            f"{lens.info['windows']} windows of {args.seq_len} tokens\nwrote {folder} ({args.layout} layout)")
