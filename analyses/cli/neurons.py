"""`resid neurons ...`: FFN neurons as key-value memories (Geva et al. 2021, 2022; see resid.analyses.neurons).

    resid neurons values --layers 20 [--neurons 5,7] [--k 10]            value's top / bottom tokens
    resid neurons top --layers 20 --neurons 5,7 [--corpus FILE] [--k 10]  top-activating contexts
    resid neurons explain "The capital of France is" [--target " Paris"]  a prediction's sub-updates
    resid neurons edit "The capital of France is" --neurons 20:5 --set 8  promote / suppress, then compare

Each prints a compact table; with --out DIR it also writes the full table (tables.export, with its
provenance sidecar) and, for values / top, an HTML figure per neuron (at most FIGURES of them).
"""


from resid.analyses.cli import arguments
from resid.analyses.cli.output import FIGURES, SHOWN, export_table, more, save_figure
from resid.errors import ResidError

EXPLAINED = 3  # layers `explain` prints without --all


def add_parser(commands, common) -> None:
    neurons = commands.add_parser("neurons", help="FFN key-value neurons: values, top contexts, sub-updates")
    actions = neurons.add_subparsers(dest="action", required=True)
    out = {"default": None, "help": "a folder: the full table (+ its .json sidecar) and any figures go in it"}
    fmt = {"default": "parquet", "choices": ["parquet", "csv", "md", "tex"], "help": "table format for --out"}

    values = actions.add_parser("values", parents=[common], help="each neuron's value read as tokens")
    values.add_argument("--layers", required=True, help="'20', '20,21' or 'all'")
    values.add_argument("--neurons", default=None, help="'5' or '5,7' (default: all)")
    values.add_argument("--k", type=int, default=10, help="top and bottom tokens per neuron (default 10)")
    values.add_argument("--raw", action="store_true", help="plain W_out @ W_U, without the final norm's gain")

    top = actions.add_parser("top", parents=[common], help="the corpus tokens that activate neurons most")
    top.add_argument("--layers", required=True, help="'20', '20,21' or 'all'")
    top.add_argument("--neurons", default=None, help="'5' or '5,7' (default: all)")
    top.add_argument("--k", type=int, default=10, help="contexts per neuron (default 10)")
    arguments.scan_options(top, "the trigger")

    explain = actions.add_parser("explain", parents=[common], help="sub-updates m_i v_i behind a prediction")
    explain.add_argument("prompt", help="the prompt whose prediction is explained")
    explain.add_argument("--pos", type=int, default=-1, help="token position (default -1, the last)")
    target = explain.add_mutually_exclusive_group()
    target.add_argument("--target", default=None, help="target token, e.g. ' Paris' (default: the top prediction)")
    target.add_argument("--target-id", type=int, default=None, help="target token id")
    explain.add_argument("--layers", default="all", help="'20', '20,21' or 'all' (default)")
    explain.add_argument("--k", type=int, default=5, help="sub-updates per layer and ranking (default 5)")

    edit = actions.add_parser("edit", parents=[common], help="set / scale coefficients, compare predictions")
    edit.add_argument("prompt", help="the prompt run with and without the edit")
    edit.add_argument("--neurons", required=True, help="layer:neuron pairs, e.g. '20:5,21:7'")
    change = edit.add_mutually_exclusive_group(required=True)
    change.add_argument("--set", type=float, default=None, help="set the coefficients to this value")
    change.add_argument("--scale", type=float, default=None, help="multiply the coefficients (0 = off)")
    edit.add_argument("--pos", type=int, default=None, help="edit only this position (default: every token)")
    edit.add_argument("--k", type=int, default=10, help="top predictions compared (default 10)")
    explain.add_argument("--all", action="store_true", help=f"every layer (default: the {EXPLAINED} layers with "
                         "the largest |update to the target logit|)")
    for parser in (values, top, explain, edit):
        parser.add_argument("--out", **out)
        parser.add_argument("--format", **fmt)
    for parser in (values, top):  # the two that read one expert's neurons in a mixture of experts
        parser.add_argument("--expert", type=int, default=None,
                            help="mixture-of-experts models (Mixtral): the expert whose neurons are read")
    for parser in (values, top):  # the two that write HTML figures
        arguments.self_contained(parser)


def check(args) -> None:
    """Normalizes in place: --layers and --neurons become lists of ints (None for all; layer:neuron pairs
    for edit), --batch-size 'auto' or an int; --corpus is read into `args.texts` (None: the demo corpus); --ray
    and --workers become `args.executor` (None: in process)."""
    arguments.at_least(args.k, 1, "--k")
    arguments.out_folder(args.out)
    if args.action in ("values", "top", "explain"):
        args.layers = arguments.layers(args.layers)
    if args.action in ("values", "top"):
        args.neurons = arguments.ints(args.neurons, "--neurons")
    if args.action == "top":
        arguments.scan(args)
    if args.action == "edit":
        args.neurons = arguments.neuron_pairs(args.neurons)


def run(model, args) -> str:
    return {"values": _values, "top": _top, "explain": _explain, "edit": _edit}[args.action](model, args)


def _values(model, args) -> str:
    from resid.analyses import neurons

    df = neurons.value_top_tokens(model, args.layers, args.neurons, k=args.k, through_final_norm=not args.raw,
                                  experts=_expert(model, args))
    pairs = list(dict.fromkeys(zip(df["layer"], df["neuron"])))
    lines = [f"value tokens of {len(pairs)} neurons ({'W_out @ W_U' if args.raw else 'through the final norm'}):"]
    grouped = df.groupby(["layer", "neuron", "direction"], observed=True, sort=False)["token"].apply(list)
    for layer, neuron in pairs[:SHOWN]:
        top, bottom = (" ".join(repr(t) for t in grouped[(layer, neuron, d)]) for d in ("top", "bottom"))
        lines.append(f"L{layer} N{neuron}  top: {top}\n{'':>{len(f'L{layer} N{neuron}')}}  bottom: {bottom}")
    lines += more(len(pairs))
    if args.out:
        from resid.analyses.neurons import plots as neuron_plots

        lines += export_table(df, args, "neuron_values")
        for layer, neuron in pairs[:FIGURES]:
            lines.append(save_figure(neuron_plots.value_bars(df, layer, neuron), args, f"values_L{layer}_N{neuron}"))
    return "\n".join(lines)


def _expert(model, args) -> list[int] | None:
    """The --expert of a mixture-of-experts model, as the analyses' `experts`; an error if it is missing or
    given for a dense model."""
    n = model.config.n_experts
    if n and args.expert is None:
        raise ResidError(f"{model.name}'s MLPs are mixtures of {n} experts: choose one with --expert E (0..{n - 1}).")
    if not n and args.expert is not None:
        raise ResidError(f"--expert is for mixture-of-experts models; {model.name}'s MLPs are dense.")
    return None if args.expert is None else [args.expert]


def _top(model, args) -> str:
    from resid.analyses import corpus, neurons

    texts = args.texts if args.texts is not None else corpus.demo(max_documents=args.max_docs)
    try:
        df = neurons.top_activating(model, texts, args.layers, args.neurons, k=args.k, context=args.context,
                                    sign=args.sign, experts=_expert(model, args),
                                    execution=arguments.execution(args.batch_size, args.quiet, args.executor))
    finally:
        if args.executor is not None:
            args.executor.close()
    pairs = list(dict.fromkeys(zip(df["layer"], df["neuron"])))
    lines = [f"top-activating tokens of {len(pairs)} neurons over {len(texts)} documents (sign={args.sign}):"]
    shown = df[df["rank"] <= 3] if len(pairs) > 1 else df
    for row in shown.head(SHOWN * 3).itertuples():
        lines.append(f"L{row.layer} N{row.neuron} #{row.rank}  m={row.coefficient:+.3f}  {row.context!r}")
    lines += more(len(shown), SHOWN * 3)
    if args.out:
        from resid.analyses.neurons import plots as neuron_plots

        lines += export_table(df, args, "neuron_contexts")
        values = neurons.value_top_tokens(model, args.layers, [n for _, n in pairs[:FIGURES]], k=10,
                                          experts=_expert(model, args))
        for layer, neuron in pairs[:FIGURES]:
            card = neuron_plots.neuron_card(values, df, layer, neuron)
            lines.append(save_figure(card, args, f"neuron_L{layer}_N{neuron}"))
    return "\n".join(lines)


def _explain(model, args) -> str:
    from resid.analyses import neurons

    target = args.target_id if args.target_id is not None else args.target
    df = neurons.sub_updates(model, args.prompt, position=args.pos, layers=args.layers, k=args.k, target=target)
    first = df.iloc[0]
    # 30 layers x 2 rankings x k rows is hundreds of lines; the layers that move the target most tell the story.
    layer_target = df.groupby("layer", sort=False)["layer_target"].first()
    kept = layer_target if args.all else layer_target[layer_target.abs().nlargest(EXPLAINED).index]
    shown = df[df["layer"].isin(kept.index)]
    which = "every layer" if len(kept) == len(layer_target) else \
        f"the {len(kept)} layers whose update moves the target logit most"
    lines = [f"sub-updates at position {first['pos']} for target {first['target']!r} (id {first['target_id']}), "
             f"{which}:",
             "layer ranking   rank neuron     m_i   |m|·|v|  to target  promotes"]
    for row in shown.itertuples():
        lines.append(f"{row.layer:>5} {row.ranking:<9} {row.rank:>4} {row.neuron:>6} {row.coefficient:>8.3f} "
                     f"{row.magnitude:>8.3f} {row.target_contribution:>+10.4f}  {row.promotes}")
    per_layer = shown.groupby(["layer", "ranking"], sort=False)[["explained_norm", "explained_target"]].first()
    lines.append(f"share of each layer's update carried by the top {args.k} (norm / target logit):")
    for (layer, ranking), row in per_layer.iterrows():
        lines.append(f"  L{layer} by {ranking:<9}  {row['explained_norm']:+.3f} / {row['explained_target']:+.3f}")
    if len(kept) < len(layer_target):
        lines.append(f"... {len(layer_target) - len(kept)} more layers (--all prints them; --out DIR writes them)")
    if args.out:
        lines += export_table(df, args, "sub_updates")
    return "\n".join(lines)


def _edit(model, args) -> str:
    from resid.analyses import neurons

    pairs = args.neurons
    positions = None if args.pos is None else [args.pos]
    if args.set is not None:
        edits = neurons.set_coefficients(model, args.prompt, pairs, args.set, positions)
    else:
        edits = neurons.scale_coefficients(model, args.prompt, pairs, args.scale, positions)
    df = neurons.prediction_change(model, args.prompt, edits, k=args.k)
    how = f"set to {args.set}" if args.set is not None else f"scaled by {args.scale}"
    where = "every token" if args.pos is None else f"position {args.pos}"
    lines = [f"coefficients of {', '.join(f'L{l} N{n}' for l, n in pairs)} {how} at {where}:",
             "  clean -> edited rank   clean -> edited prob   token"]
    for row in df.itertuples():
        lines.append(f"  {row.clean_rank:>5} -> {row.edited_rank:<6}     {row.clean_prob:.4f} -> "
                     f"{row.edited_prob:.4f}      {row.token!r}")
    if args.out:
        lines += export_table(df, args, "prediction_change")
    return "\n".join(lines)
