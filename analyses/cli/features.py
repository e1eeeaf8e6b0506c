"""`resid features ...`: a learned dictionary's features (SAEs, transcoders; see resid.analyses.features), the way
`resid neurons` reads MLP neurons.

    resid features values --dictionary DIR [--features 3,7] [--k 10]           decoder's top / bottom tokens
    resid features top --dictionary DIR --features 3,7 [--corpus FILE] [--k 10]  top-activating contexts + cards

--dictionary is a local dictionary folder in any format resid.dictionaries.load reads (SAELens, sparsify, Gemma
Scope, circuit-tracer per-layer sets), or a folder of them (what `resid train-sae --out DIR` writes); --layers
picks from a per-layer set (default: every dictionary in it), and --features the same features of each (default:
all). Each prints a compact table; with --out DIR it also writes the
full table (tables.export, with its provenance sidecar) and an HTML figure per feature (at most FIGURES): its value
tokens for `values`, its card (resid.analyses.features.card) for `top`.
"""

from pathlib import Path

from resid.analyses.cli import arguments
from resid.analyses.cli.output import FIGURES, SHOWN, export_table, more, notes, save_figure
from resid.errors import ResidError


def add_parser(commands, common) -> None:
    features = commands.add_parser("features", help="a dictionary's features: decoder tokens, top contexts, cards")
    actions = features.add_subparsers(dest="action", required=True)
    values = actions.add_parser("values", parents=[common], help="each feature's decoder direction read as tokens")
    values.add_argument("--raw", action="store_true", help="plain W_dec @ W_U, without the final norm's gain")
    values.add_argument("--encoder", action="store_true",
                        help="the encoder direction read against the token embeddings instead of the decoder")
    top = actions.add_parser("top", parents=[common], help="the corpus tokens that activate features most")
    arguments.scan_options(top, "the activating one")
    for parser, k in ((values, "top and bottom tokens per feature"), (top, "contexts per feature")):
        parser.add_argument("--dictionary", required=True, help="a local dictionary folder (SAELens, sparsify, "
                            "Gemma Scope, circuit-tracer), or a folder of them (resid train-sae's --out)")
        parser.add_argument("--hook", default=None, help="the hook a dictionary file does not name (Gemma Scope 1), "
                            "e.g. blocks.3.hook_resid_post")
        parser.add_argument("--layers", default="all", help="'3', '3,4' or 'all' (default): the dictionaries of a "
                            "per-layer set that reconstruct those layers")
        parser.add_argument("--features", default=None, help="'3' or '3,7' (default: all)")
        parser.add_argument("--k", type=int, default=10, help=f"{k} (default 10)")
        parser.add_argument("--out", default=None,
                            help="a folder: the full table (+ its .json sidecar) and any figures go in it")
        parser.add_argument("--format", default="parquet", choices=["parquet", "csv", "md", "tex"],
                            help="table format for --out")
        arguments.self_contained(parser)


def check(args) -> None:
    """Normalizes in place: --layers and --features become lists of ints (None for all), --batch-size 'auto' or an
    int; --dictionary must be a dictionary folder; --corpus is read into `args.texts` (None: the demo corpus); --ray
    and --workers become `args.executor` (None: in process)."""
    from resid.dictionaries import detect

    arguments.at_least(args.k, 1, "--k")
    arguments.out_folder(args.out)
    args.layers = arguments.layers(args.layers)
    args.features = arguments.ints(args.features, "--features")
    folder = Path(args.dictionary).expanduser()
    if not folder.is_dir():
        raise ResidError(f"--dictionary {args.dictionary} is not a folder: give a local dictionary folder (e.g. one "
                         "holding SAELens's cfg.json and sae_weights.safetensors).")
    detect(folder)  # an unknown layout is refused before the model loads
    if args.action == "top":
        arguments.scan(args)


def run(model, args) -> str:
    return {"values": _values, "top": _top}[args.action](model, args)


def dictionaries(model, args) -> list:
    """The dictionaries of --dictionary (checked against the model) that reconstruct a layer of --layers."""
    import resid.dictionaries
    from resid.analyses.checks import select_layers

    loaded = resid.dictionaries.load(args.dictionary, model, hook=args.hook)
    if isinstance(loaded, resid.dictionaries.CrossLayerTranscoder):
        raise ResidError(f"--dictionary {args.dictionary} is a cross-layer transcoder; `resid features` reads "
                         "per-layer dictionaries.")
    found = loaded if isinstance(loaded, list) else [loaded]
    if args.layers is None:
        return found
    wanted = select_layers(model, args.layers)
    kept = [d for d in found if d.point_out.site.layer in wanted]
    if not kept:
        have = sorted({d.point_out.site.layer for d in found})
        raise ResidError(f"--layers {','.join(map(str, wanted))}: no dictionary of {args.dictionary} reconstructs "
                         f"those layers; its dictionaries are at layers {have} (--layers all: every one).")
    return kept


def _values(model, args) -> str:
    import pandas as pd

    from resid.analyses.features import views
    from resid.analyses.features.examples import select_features
    from resid.dictionaries import feature_site

    found = dictionaries(model, args)
    read = views.encoder_top_tokens if args.encoder else views.decoder_top_tokens
    options = {} if args.encoder else {"through_final_norm": not args.raw}
    frames = [read(model, d, select_features(d, args.features), k=args.k, **options) for d in found]
    df = pd.concat(frames, ignore_index=True)
    by_name = {d.name: d for d in found}
    pairs = list(dict.fromkeys(zip(df["dictionary"], df["feature"])))
    how = "encoder directions against the token embeddings" if args.encoder else \
        "decoder directions, " + ("W_dec @ W_U" if args.raw else "through the final norm")
    lines = [f"{how}, {len(pairs)} features:"]
    grouped = df.groupby(["dictionary", "feature", "direction"], observed=True, sort=False)["token"].apply(list)
    for name, feature in pairs[:SHOWN]:
        label = feature_site(by_name[name], feature, found).label
        top, bottom = (" ".join(repr(t) for t in grouped[(name, feature, d)]) for d in ("top", "bottom"))
        lines.append(f"{label}  top: {top}\n{'':>{len(label)}}  bottom: {bottom}")
    lines += more(len(pairs))
    if args.out:
        from resid.analyses.neurons import plots as neuron_plots

        lines += export_table(df, args, "feature_encoder" if args.encoder else "feature_values")
        for name, feature in pairs[:FIGURES]:
            rows = df[(df["dictionary"] == name) & (df["feature"] == feature)]
            fig = neuron_plots.value_bars(rows.assign(layer=0, neuron=feature), 0, feature)
            fig.update_layout(title=f"{feature_site(by_name[name], feature).label} ({name}): "
                                    f"{'encoder' if args.encoder else 'decoder'} tokens")
            lines.append(save_figure(fig, args, f"values_{_file_name(by_name[name], feature)}"))
    return "\n".join(lines)


def _top(model, args) -> str:
    from resid.analyses import corpus, features

    found = dictionaries(model, args)
    texts = args.texts if args.texts is not None else corpus.demo(max_documents=args.max_docs)
    try:
        df = features.top_activating(model, found, texts, features=args.features, k=args.k, context=args.context,
                                     sign=args.sign,
                                     execution=arguments.execution(args.batch_size, args.quiet, args.executor))
    finally:
        if args.executor is not None:
            args.executor.close()
    tokens = df.attrs["provenance"]["parameters"]["tokens"]
    sites = list(dict.fromkeys(df["site"]))
    lines = [f"top-activating tokens of {len(sites)} features over {len(texts)} documents ({tokens} tokens, "
             f"sign={args.sign}):"]
    shown = df[df["rank"] <= 3] if len(sites) > 1 else df
    for row in shown.head(SHOWN * 3).itertuples():
        lines.append(f"{row.site} #{row.rank}  a={row.activation:+.3f}  {row.context!r}")
    lines += more(len(shown), SHOWN * 3)
    lines += notes(df)
    if args.out:
        by_name = {d.name: d for d in found}
        lines += export_table(df, args, "feature_contexts")
        for name, feature in list(dict.fromkeys(zip(df["dictionary"], df["feature"])))[:FIGURES]:
            card = features.card(model, by_name[name], int(feature), df)
            lines.append(save_figure(card, args, f"feature_{_file_name(by_name[name], feature)}"))
    return "\n".join(lines)


def _file_name(d, feature: int) -> str:
    """L3_resid_post_F7: the feature's site, as a file name."""
    site = d.point_out.site
    return f"L{site.layer}_{site.part}_F{feature}"
