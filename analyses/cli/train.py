"""`resid train-sae` / `resid train-transcoder` / `resid train-clt`: train dictionaries on a corpus
(resid.analyses.training), resumably, write them (SAELens's format; a CLT in circuit-tracer's) and evaluate them on
held-out paragraphs.

    resid train-sae --layers 15 --out smollm2-sae --k 32 --expansion 8 --tokens 2000000           # the demo corpus
    resid train-sae --layers 15 --site resid_pre --activation jumprelu --l0-coefficient 1 --out sae --corpus notes.txt
    resid train-transcoder --layers all --out transcoders --activation batchtopk --k 16 --tokens 500000
    resid train-sae --transcoder ...                                     (the same as train-transcoder)
    resid train-clt --out clt --activation batchtopk --k 16 --expansion 2 --tokens 262144   # every layer, one CLT
    resid train-sae --layers 15 --out sae --ray --workers 2    # the activations made by 2 Ray workers, one model each

All layers given train from one forward pass per batch; --site picks the resid Site an SAE reads at each layer
(resid_pre, resid_mid, resid_post, or attn and mlp: the sublayer's write). DIR gets checkpoint.safetensors every
--checkpoint-every steps (after a kill, rerun the same command with --resume; a second command training into DIR
meanwhile is refused), then one SAELens folder per dictionary (cfg.json + sae_weights.safetensors, named by its
TransformerLens hook) and evaluation.md (FVU, L0, dead and dense fractions, CE loss recovered, KL) over
--eval-windows windows of the held-out paragraphs (--held-out, split as `resid lens train`); the terminal gets the
same table as plain text.

What will be done is said on stderr before it starts, where it differs from what was asked: --tokens rounded down
to whole batches, and the shuffling buffer's size when --buffer-tokens is not given (sized from the free memory).
"""

import math
import sys
from pathlib import Path

from resid.analyses.cli import arguments
from resid.analyses.cli.errors import render
from resid.analyses.cli.lens_data import corpus_options, held_out_split
from resid.errors import ResidError, param_style

# --site: the part of resid.Site(layer, part) an SAE reads, a Site word (attn, mlp: the sublayer's write)
SITES = ("resid_pre", "resid_mid", "resid_post", "attn", "mlp")
# TransformerLens's names of the sublayer writes, once taken here -> the Site word to give instead
RETIRED = {"attn_out": "attn", "mlp_out": "mlp"}
# Recipe parameters -> flags, beside those resid.analyses.cli.errors already maps (k, batch_size, steps)
FLAGS = {"activation": "--activation", "expansion": "--expansion", "d_sae": "--d-sae", "lr": "--lr",
         "warmup_steps": "--warmup-steps", "decay_steps": "--decay-steps", "l1_coefficient": "--l1-coefficient",
         "l0_coefficient": "--l0-coefficient", "b_dec_init": "--b-dec-init", "steps": "--tokens / --batch-size",
         "buffer_tokens": "--buffer-tokens", "dead_tokens": "--dead-tokens", "normalize": "--normalize",
         "max_norm_ratio": "--max-norm-ratio"}


def _render(name: str, value: object) -> str | None:
    if name in FLAGS:
        return FLAGS[name] if value is None or name == "steps" else f"{FLAGS[name]} {value}"
    return render(name, value)


def add_parser(commands, common) -> None:
    for name, transcoder, crosslayer in (("train-sae", False, False), ("train-transcoder", True, False),
                                         ("train-clt", True, True)):
        what = ("a cross-layer transcoder (every layer's MLP input -> its own and every later MLP output)"
                if crosslayer else "transcoders (MLP input -> MLP output)" if transcoder else "sparse autoencoders")
        parser = commands.add_parser(name, parents=[common], help=f"train {what} on a corpus, resumably")
        parser.set_defaults(command="train", transcoder=transcoder, crosslayer=crosslayer, skip=False, layers="all")
        parser.add_argument("--out", required=True, help="a folder: the checkpoint, the dictionaries, evaluation.md")
        if not crosslayer:
            parser.add_argument("--layers", required=True, help="layer indices, e.g. '15' or '3,9,15', or 'all'")
        if not transcoder:
            parser.add_argument("--site", default="resid_post", help="the Site part an SAE reads: "
                                f"{', '.join(SITES)} (default resid_post)")
            parser.add_argument("--transcoder", action="store_true", help="train transcoders instead "
                                "(= resid train-transcoder)")
        if not crosslayer:
            parser.add_argument("--skip", action="store_true", help="transcoders with a skip path x @ W_skip")
        else:
            parser.add_argument("--tanh-scale", type=float, default=None, help="jumprelu: c of the sparsity term "
                                "tanh(c |W_dec| a) (default 1)")
        corpus_options(parser)
        parser.add_argument("--activation", default=None,
                            choices=["batchtopk", "jumprelu"] if crosslayer else ["topk", "batchtopk", "relu",
                                                                                  "jumprelu"],
                            help="recipe (default: topk for SAEs, batchtopk for transcoders; see "
                            "resid.analyses.training.recipe)")
        parser.add_argument("--k", type=int, default=32, help="topk / batchtopk: active features (default 32)")
        parser.add_argument("--expansion", type=int, default=8, help="d_sae = expansion * width (default 8)")
        parser.add_argument("--d-sae", type=int, default=None, help="features (overrides --expansion)")
        parser.add_argument("--tokens", type=int, default=1_000_000, help="training tokens (default 1M)")
        parser.add_argument("--batch-size", type=int, default=4096, help="tokens per step (default 4096)")
        parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the recipe's)")
        parser.add_argument("--warmup-steps", type=int, default=None, help="default: 5%% of the steps")
        parser.add_argument("--decay-steps", type=int, default=None, help="default: the last 20%% of the steps")
        parser.add_argument("--l1-coefficient", type=float, default=5.0, help="relu: L1 weight (default 5)")
        parser.add_argument("--l0-coefficient", type=float, default=1.0, help="jumprelu: L0 weight (default 1)")
        parser.add_argument("--window", type=int, default=256, help="tokens per window (default 256)")
        parser.add_argument("--forward-batch", type=int, default=8, help="windows per forward pass (default 8)")
        parser.add_argument("--buffer-tokens", type=int, default=None, help="training tokens per shuffling "
                            "buffer (default: a quarter of the free memory, at most 65536; 150 MB per hook of width "
                            "576)")
        parser.add_argument("--keep-bos", action="store_true",
                            help="train on each window's first position too (the BOS, or the first token of a model "
                                 "that prepends none: the attention sink)")
        parser.add_argument("--max-norm-ratio", type=float, default=10.0,
                            help="leave out tokens whose activation norm exceeds this multiple of the median "
                                 "(attention sinks; default 10; 0 keeps every token)")
        parser.add_argument("--autocast", action="store_true",
                            help="run the model under bf16 autocast (SAELens's autocast_lm; faster, CPU too)")
        parser.add_argument("--normalize", default=None,
                            choices=["none", "constant_norm_rescale", "expected_average_only_in"],
                            help="SAELens's activation normalisation (default: none for SAEs, "
                                 "expected_average_only_in for transcoders, whose output's scale is not their "
                                 "input's; constant_norm_rescale is saved in cfg.json, expected_average_only_in "
                                 "folded into the weights)")
        parser.add_argument("--dead-tokens", type=int, default=None,
                            help="tokens without firing after which a feature counts as dead (and AuxK revives it; "
                                 "default: a tenth of --tokens, at most sparsify's 10M)")
        parser.add_argument("--seed", type=int, default=0, help="of the initialisation and data order (default 0)")
        parser.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints "
                            "(default: every 4%% of the steps, at most 100 apart)")
        parser.add_argument("--resume", action="store_true", help="continue the run checkpointed in --out")
        parser.add_argument("--eval-windows", type=int, default=32, help="held-out windows evaluated (default 32; "
                            "0: none)")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")
        arguments.executor_options(parser)


def check(args) -> None:
    for flag in ("tokens", "batch_size", "window", "forward_batch", "k", "expansion"):
        arguments.at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    for flag in ("buffer_tokens", "d_sae", "checkpoint_every"):
        if getattr(args, flag) is not None:
            arguments.at_least(getattr(args, flag), 1, "--" + flag.replace("_", "-"))
    arguments.at_least(args.eval_windows, 0, "--eval-windows")
    for flag in ("warmup_steps", "decay_steps"):
        if getattr(args, flag) is not None:
            arguments.at_least(getattr(args, flag), 0, "--" + flag.replace("_", "-"))
    if args.dead_tokens is not None:
        arguments.at_least(args.dead_tokens, 1, "--dead-tokens")
    if not 0 <= args.seed < 2**63:  # torch's generators take a 64-bit seed
        raise ResidError(f"--seed must be a whole number from 0 to 2^63 - 1 ({2**63 - 1}), got {args.seed}.")
    arguments.out_folder(args.out)
    args.layer_list = arguments.layers(args.layers)
    _check_site(args)
    if args.tokens < args.batch_size:
        raise ResidError(f"--tokens {args.tokens} is less than one batch (--batch-size {args.batch_size}).")
    if (Path(args.out) / "checkpoint.safetensors").exists() and not args.resume:
        raise ResidError(f"{args.out} holds a checkpoint of an earlier run: pass --resume to continue it, or choose "
                         "another --out.")
    from resid.analyses.training.recipe import Recipe

    activation = args.activation or ("batchtopk" if args.transcoder else "topk")
    with param_style(_render):
        args.recipe = Recipe.for_budget(
            args.tokens, args.batch_size, transcoder=args.transcoder, activation=activation,
            expansion=args.expansion, d_sae=args.d_sae, k=args.k, lr=args.lr, warmup_steps=args.warmup_steps,
            decay_steps=args.decay_steps, l1_coefficient=args.l1_coefficient, l0_coefficient=args.l0_coefficient,
            seed=args.seed, dead_tokens=args.dead_tokens, normalize=args.normalize)
    args.tanh_scale = _tanh_scale(args, activation)
    _fits_at_all(args)
    steps = args.recipe.steps
    if args.tokens % args.batch_size:
        _note(f"training {steps} steps of {args.batch_size} tokens = {steps * args.batch_size:,} tokens (--tokens "
              f"{args.tokens} rounded down to whole batches of --batch-size {args.batch_size})")
    if args.buffer_tokens is not None and args.buffer_tokens > steps * args.batch_size:
        _note(f"a shuffling buffer of {steps * args.batch_size:,} tokens, the whole training budget (--buffer-tokens "
              f"{args.buffer_tokens:,} is more than the run trains on, and a buffer is filled before its first step)")
        args.buffer_tokens = steps * args.batch_size
    held_out_split(args)
    args.executor = arguments.executor(args.ray, args.workers)  # last: nothing to close if a check above fails


def _check_site(args) -> None:
    site = getattr(args, "site", "resid_post")  # train-transcoder and train-clt read the MLP's input
    if site in RETIRED:
        raise ResidError(f"--site {site} is TransformerLens's name; the command line takes resid's Site words: "
                         f"--site {RETIRED[site]} (Site(layer, {RETIRED[site]!r}), the sublayer's write).")
    if site not in SITES:
        raise ResidError(f"--site {site!r} is not a site an SAE reads: choose one of {', '.join(SITES)}.")


def _tanh_scale(args, activation: str) -> float | None:
    """--tanh-scale (train-clt): c of the JumpReLU sparsity term, a positive finite number; refused with BatchTopK,
    which has no such term. None for the per-layer commands, which have no such flag."""
    if not args.crosslayer:
        return None
    if args.tanh_scale is None:
        from resid.analyses.training.crosslayer import TANH_SCALE

        return TANH_SCALE
    if activation != "jumprelu":
        raise ResidError(f"--tanh-scale {args.tanh_scale} sets the JumpReLU sparsity term, which --activation "
                         f"{activation} does not have: drop --tanh-scale, or use --activation jumprelu.")
    if not math.isfinite(args.tanh_scale) or args.tanh_scale <= 0:
        raise ResidError(f"--tanh-scale must be a positive finite number (the c of tanh(c |W_dec| a)), got "
                         f"{args.tanh_scale}.")
    return args.tanh_scale


def _note(text: str) -> None:
    """What will be done, where it differs from what was asked: one line on stderr, before it starts."""
    print(f"resid: {text}", file=sys.stderr)


def _fits_at_all(args) -> None:
    """Before the model loads, the widths no machine of this memory could train at any model width (d_in 1): each
    feature costs at least its weights' 3 x 16 bytes and its batch's activations. The exact check, at the model's
    widths, runs before anything is allocated (resid.analyses.training.loop)."""
    import torch

    from resid.batching import available_bytes

    if args.device not in (None, "cpu"):  # a GPU's free memory is asked once the model is there
        return
    free = available_bytes(torch.device("cpu"))
    per_feature = 48 + 12 * args.batch_size
    features = args.d_sae if args.d_sae is not None else args.expansion
    layers = len(args.layer_list) if args.layer_list is not None else 1
    if free is not None and features * per_feature * layers > 0.8 * free:
        flag = f"--d-sae {args.d_sae}" if args.d_sae is not None else f"--expansion {args.expansion}"
        raise ResidError(f"{flag} cannot fit: even at width 1, {layers} dictionar{'y' if layers == 1 else 'ies'} "
                         f"of {features:,} features need{'s' if layers == 1 else ''} "
                         f"{features * per_feature * layers / 2**30:,.0f} GiB, and {free / 2**30:.1f} GiB are free. "
                         f"At most {int(0.8 * free / per_feature / layers):,} features per dictionary could fit (fewer "
                         "at the model's width, which the check after loading it names exactly): lower the flag.")


def run(model, args) -> str:
    from resid.analyses.distributed.execution import Execution
    from resid.analyses.io import tables
    from resid.analyses.training.crosslayer import train_crosslayer
    from resid.analyses.training.evaluation import evaluate
    from resid.analyses.training.loop import Spec, buffer_size, train
    from resid.analyses.training.replacements import evaluate_replacements
    from resid.sites import Site

    layers = args.layer_list if args.layer_list is not None else list(range(model.config.n_layers))
    bad = [l for l in layers if not 0 <= l < model.config.n_layers]
    if bad:
        raise ResidError(f"--layers {bad} out of range: {model.name} has layers 0..{model.config.n_layers - 1}.")
    if args.crosslayer:
        specs = [Spec.transcoder(model, l) for l in layers]
    elif args.transcoder:
        specs = [Spec.transcoder(model, l, skip=args.skip) for l in layers]
    else:
        specs = [Spec(Site(l, args.site)) for l in layers]
    training, held_out = args.split(model)
    ratio = args.max_norm_ratio or None  # 0: keep every token
    buffer_tokens = args.buffer_tokens
    if buffer_tokens is None:
        buffer_tokens = buffer_size(model, specs, args.recipe.batch_size, args.out, args.device)
        _note(f"a shuffling buffer of {buffer_tokens:,} tokens (at most a quarter of the free memory, or the resumed "
              "checkpoint's; --buffer-tokens sets it)")
    progress = False if args.quiet else None
    execution = Execution(args.executor, batch_size=args.forward_batch, progress=progress, out=args.out,
                          checkpoint_every=args.checkpoint_every)
    try:
        options = dict(window=args.window, buffer_tokens=buffer_tokens, keep_bos=args.keep_bos,
                       autocast=args.autocast, max_norm_ratio=ratio)
        with param_style(_render):
            if args.crosslayer:
                dictionaries = [train_crosslayer(model, training, args.recipe, execution, tanh_scale=args.tanh_scale,
                                                 **options)]
            else:
                dictionaries = train(model, training, specs, args.recipe, execution, **options)
        if args.eval_windows:
            evaluation = dict(max_windows=args.eval_windows, window=args.window, keep_bos=args.keep_bos,
                              max_norm_ratio=ratio, execution=Execution(args.executor, progress=progress))
            if args.crosslayer:
                df = evaluate_replacements(model, {"clt": dictionaries[0]}, held_out, **evaluation).table
            else:
                df = evaluate(model, dictionaries, held_out, **evaluation)
    finally:
        if args.executor is not None:
            args.executor.close()
    recipe = args.recipe
    budget = f"on {recipe.steps} steps of {recipe.batch_size} tokens ({recipe.steps * recipe.batch_size:,} tokens)"
    if args.crosslayer:
        lines = [f"trained a {recipe.activation} cross-layer transcoder of {model.name} over its "
                 f"{model.config.n_layers} layers ({dictionaries[0].d_sae:,} features each) {budget}; wrote "
                 f"{args.out}/clt/ (circuit-tracer's CLT format)"]
    else:
        lines = [f"trained {len(dictionaries)} {recipe.activation} "
                 f"{'transcoder' if args.transcoder else 'SAE'}(s) of {model.name} {budget}; wrote {args.out}/<hook>/ "
                 "(SAELens format)"]
    if recipe.activation == "batchtopk":
        horizon = round(1 / (1 - recipe.threshold_beta))
        lines.append(f"BatchTopK keeps k={recipe.k} features per token on average over each training batch (the "
                     "bar's l0); the exported JumpReLU fires per token where a feature exceeds one threshold, a moving "
                     f"average over the last ~{horizon} steps (a quarter of the run, at most 1000) of each batch's "
                     "smallest kept activation, so its l0 (measured below) differs from k")
    if args.eval_windows:
        path = Path(args.out) / "evaluation.md"
        tables.export(df, path)
        lines.append(plain_table(df.drop(columns=["site_in"], errors="ignore")))
        lines.append(f"wrote {path}")
    return "\n".join(lines)


def plain_table(df) -> str:
    """The table as the terminal shows it: aligned plain text (the Markdown, escapes and all, goes to the .md)."""
    return df.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="--")
