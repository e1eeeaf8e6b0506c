"""`resid qk "prompt" --transcoders DIR --layer L --head H [--query -1] [--key K] [--versus K2 | --versus mean]`:
why a head attended where it did (resid.analyses.graphs.qk). The head's pre-softmax score at (query, key) split into
pairs of query-side and key-side terms (the embeddings, earlier heads' writes, transcoder features, errors, skip
paths and constants at each position), exactly: prints the score, the top pairs and the terms that raise it most on
each side; --versus contrasts it with another key (or with the pattern-weighted mean over keys); --validate K removes
the K strongest terms of each side in the real model and prints the measured score and pattern beside the
prediction. Without --head: every head of --layer (or of every layer) at the query, its most attended key, its
strongest pair and terms. --out writes the table (.csv .parquet .tex .md).

--transcoders is read as `resid graph` reads it (one transcoder per layer, a cross-layer transcoder, or a folder of
SAELens transcoder folders as `resid train-transcoder --layers all` writes).
"""

from resid.analyses.cli import arguments
from resid.analyses.cli.graph import load_transcoders, summary
from resid.errors import ResidError

SHOWN = 10  # pairs and terms printed


def add_parser(commands, common) -> None:
    parser = commands.add_parser("qk", parents=[common], help="QK attribution: why a head attended where it did")
    parser.add_argument("text", help="the prompt")
    parser.add_argument("--transcoders", required=True, help="a local folder: one transcoder per layer or a "
                        "cross-layer transcoder (as resid graph reads it)")
    parser.add_argument("--layer", type=int, default=None, help="the head's layer (default: every layer)")
    parser.add_argument("--head", type=int, default=None, help="the head (default: every head of --layer)")
    parser.add_argument("--query", type=int, default=-1, help="the query position (default -1: the last)")
    parser.add_argument("--key", type=int, default=None, help="the key position (default: the key the head "
                        "attends to most)")
    parser.add_argument("--versus", default=None, help="a second key position (the contrast score(q, key) - "
                        "score(q, versus)), or 'mean' (the score minus the pattern-weighted mean over keys)")
    parser.add_argument("--top", type=int, default=SHOWN, help=f"pairs and terms printed and written (default "
                        f"{SHOWN})")
    parser.add_argument("--validate", type=int, default=0, help="remove the K strongest terms of each side in the "
                        "real model and compare with the prediction (default 0: no check)")
    parser.add_argument("--bos", default="auto", choices=["auto", "skip", "keep"], help="position 0's features and "
                        "errors are constants ('skip'), as in resid graph; 'auto' (default): when the prompt starts "
                        "with the BOS token")
    parser.add_argument("--out", default=None, help="a file (.csv .parquet .tex .md) for the table")


def check(args) -> None:
    from pathlib import Path

    from resid.analyses.io import suffixes

    if not args.text:
        raise ResidError("The prompt is empty: resid qk explains a head's attention over a prompt. Give one, e.g. "
                         "resid qk 'When Mary and John went to the store, John gave a drink to' --transcoders DIR.")
    if args.head is not None and args.layer is None:
        raise ResidError(f"--head {args.head} needs --layer: a head is named by its layer and its index.")
    if args.head is None and (args.key is not None or args.versus is not None or args.validate):
        raise ResidError("--key, --versus and --validate explain one head: give --layer and --head.")
    if args.versus is not None and args.versus != "mean":
        try:
            args.versus = int(args.versus)
        except ValueError:
            raise ResidError(f"--versus {args.versus!r} is a key position (an integer) or 'mean'.") from None
    arguments.at_least(args.top, 1, "--top")
    arguments.at_least(args.validate, 0, "--validate")
    arguments.out_path(args.out, suffixes.TABLE)
    if not Path(args.transcoders).expanduser().is_dir():
        raise ResidError(f"--transcoders {args.transcoders} is not a folder: give a local transcoder folder (a "
                         "circuit-tracer set with its config.yaml, or per-layer SAELens / sparsify transcoders).")


def run(model, args) -> str:
    import pandas as pd

    from resid.analyses import tables
    from resid.analyses.graphs.attribute import token_strs
    from resid.analyses.graphs.qk import QK

    transcoders = load_transcoders(args.transcoders, model)
    qk = QK(model, args.text, transcoders, skip_bos={"auto": None, "skip": True, "keep": False}[args.bos])
    tokens = token_strs(model, qk.rep.token_ids)
    lines = [f"model: {model.name}   prompt: {qk.n_pos} tokens   transcoders: "
             f"{summary(transcoders, args.transcoders)}"]
    if args.head is None:
        table = qk.heads(query=args.query, layers=None if args.layer is None else [args.layer])
        lines.append(f"every head at position {table['head'][0].rsplit('@', 1)[1]}: the key it attends to most, "
                     "its strongest pair and terms")
        for row in table.itertuples():
            lines.append(f"  {row.head:<30} key {row.key:>3} {tokens[row.key]!r:<12} pattern {row.pattern:6.3f}  "
                         f"{row.pair_query} x {row.pair_key} {row.pair_value:+.3f}")
    else:
        result = qk.score(args.layer, args.head, query=args.query, key=args.key, versus=args.versus)
        key = next(iter(result.weights))
        lines.append(f"{result.head_site.label} ({tokens[result.query]!r}) at key {key} ({tokens[key]!r}): score "
                     f"{result.run_scores[key]:.4f}, pattern {result.pattern[key]:.4f}")
        if args.versus is not None:
            what = "the pattern-weighted mean over keys" if args.versus == "mean" else \
                f"key {args.versus} ({tokens[args.versus]!r}, score {result.run_scores[args.versus]:.4f})"
            lines.append(f"contrast: the score minus {what}")
        lines.append(f"the pairs sum to {result.raw:.4f} (the run's raw score{'s' if len(result.weights) > 1 else ''}"
                     f": {result.run_raw:.4f}); {len(result.query_sites)} query-side x {len(result.key_sites)} "
                     "key-side terms")
        pairs = result.top(args.top)
        lines.append("top pairs (query-side term x key-side term):")
        lines += [f"  {row.value:+9.4f}  {row.query:<34} x {row.key}" for row in pairs.itertuples()]
        query_side, key_side = result.query_marginal().head(args.top), result.key_marginal().head(args.top)
        lines.append("query-side terms (what makes the head look):")
        lines += [f"  {row.value:+9.4f}  {row.site}" for row in query_side.itertuples()]
        lines.append("key-side terms (what makes the key attractive):")
        lines += [f"  {row.value:+9.4f}  {row.site}" for row in key_side.itertuples()]
        table = pd.concat([pairs.assign(table="pair"),
                           query_side.rename(columns={"site": "query"}).assign(table="query", key=None),
                           key_side.rename(columns={"site": "key"}).assign(table="key", query=None)],
                          ignore_index=True)
        # the head Site, in the column every-head tables name it in, so that the file says which head it explains
        table = table.assign(head=result.head_site.label)[["head", "table", "query", "key", "value"]]
        if args.validate:
            check = qk.validate(result, top=args.validate)
            lines.append("validation: each term removed from the residual the head reads, in the real model:")
            lines += [f"  {row.side:<5} {row.term:<34} score predicted {row.predicted_score:+8.4f} measured "
                      f"{row.measured_score:+8.4f}   pattern predicted {row.predicted_pattern:.4f} measured "
                      f"{row.measured_pattern:.4f}" for row in check.itertuples()]
    if args.out is not None:
        lines.append(f"wrote {tables.export(table, args.out)} ({len(table)} rows)")
    return "\n".join(lines)
