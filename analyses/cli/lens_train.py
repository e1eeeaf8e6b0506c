"""`resid lens train --out DIR`: train a tuned lens (resid.analyses.lenses.training, tuned-lens's recipe) on a
corpus, resumably, and write it into DIR.

    resid lens train --out smollm2-lens --steps 96 --tokens-per-step 512 --seq-len 512     # the demo corpus
    resid lens train --out lens --corpus notes.txt --every sublayer --layout tuned-lens

The corpus is split by paragraph (resid.analyses.lenses.data.split): --held-out of it never reaches training, and
`resid lens eval` with the same --corpus, --max-docs and --held-out evaluates on exactly that part. DIR gets
checkpoint.safetensors every --checkpoint-every steps (rerun the same command after a kill: it resumes; a second
command training into DIR meanwhile is refused) and translators.safetensors at the end (or config.json + params.pt
with --layout tuned-lens).
"""


from resid.analyses.cli import arguments
from resid.analyses.cli.errors import render
from resid.analyses.cli.lens_data import corpus_options, held_out_split
from resid.errors import param_style

# Recipe parameters -> flags, beside those resid.analyses.cli.errors already maps
FLAGS = {"lr_scale": "--lr-scale", "steps": "--steps", "tokens_per_step": "--tokens-per-step", "seq_len": "--seq-len"}


def _render(name: str, value: object) -> str | None:
    if name in FLAGS:
        return FLAGS[name] if value is None else f"{FLAGS[name]} {value}"
    return render(name, value)


def add_parser(commands, common) -> None:
    parser = commands.add_parser("lens train", parents=[common], help="train a tuned lens on a corpus, resumably")
    parser.add_argument("--out", required=True, help="a folder: the checkpoint while training, then the lens")
    corpus_options(parser)
    parser.add_argument("--steps", type=int, default=250, help="optimizer steps (default 250, tuned-lens's)")
    parser.add_argument("--tokens-per-step", type=int, default=2048,
                        help="tokens per step, a multiple of --seq-len (default 2048; tuned-lens's is 262144)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per window (default 512)")
    parser.add_argument("--every", default="layer", choices=["layer", "sublayer"],
                        help="translators at every layer input (default, tuned-lens's), or also at every resid_mid")
    parser.add_argument("--precision", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="the readout's matmul in training (default auto: bfloat16, as tuned-lens autocasts, "
                             "where the device runs it at least as fast as float32, else float32)")
    parser.add_argument("--lr-scale", type=float, default=1.0, help="learning rate = lr-scale * 0.1 (default 1)")
    parser.add_argument("--seed", type=int, default=42, help="of the data order (default 42)")
    parser.add_argument("--layout", default="resid", choices=["resid", "tuned-lens"],
                        help="resid's translators.safetensors (default) or tuned-lens's config.json + params.pt")
    parser.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints (default: "
                        "every 4%% of the steps, at most 100 apart: every 10 of the default 250)")
    parser.add_argument("--batch-size", type=int, default=None, help="windows per forward pass (default: 2048 "
                        "tokens' worth)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def check(args) -> None:
    from resid.analyses.lenses.training import Recipe

    arguments.out_folder(args.out)
    for flag in ("steps", "tokens_per_step", "seq_len"):
        arguments.at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    if args.checkpoint_every is not None:
        arguments.at_least(args.checkpoint_every, 1, "--checkpoint-every")
    if args.batch_size is not None:
        arguments.at_least(args.batch_size, 1, "--batch-size")
    with param_style(_render):
        args.recipe = Recipe(steps=args.steps, tokens_per_step=args.tokens_per_step, seq_len=args.seq_len,
                             lr_scale=args.lr_scale, precision=args.precision, every=args.every, seed=args.seed)
    held_out_split(args)


def run(model, args) -> str:
    from resid.analyses import tuned_lens
    from resid.analyses.distributed.execution import Execution

    training, _ = args.split(model)
    execution = Execution(batch_size=args.batch_size or "auto", progress=False if args.quiet else None,
                          out=args.out, checkpoint_every=args.checkpoint_every)
    with param_style(_render):
        lens = tuned_lens.train(model, training, args.recipe, execution)
    folder = tuned_lens.write(lens, args.out, layout=args.layout)
    losses = lens.translators.info["losses"]
    return (f"trained a tuned lens of {model.name}: {len(lens.translators.sites)} translators (every {args.every}), "
            f"{args.steps} steps of {args.tokens_per_step} tokens; mean KL over sites {losses[0]:.3f} -> "
            f"{losses[-1]:.3f} nats (first and last step)\nwrote {folder} ({args.layout} layout)")
