"""The worked example of attention in attribution graphs: SmolLM2-135M on an IOI prompt, through per-layer
transcoders trained by `resid train-transcoder --layers all --out DIR`. Which heads move the name to the last
position, and what at the name makes them attend to it rather than to the other name.

    python benchmarks/qk_ioi.py --transcoders DIR [--heads 3] [--validate 5] [--out ioi.json]

1. the graph       graphs.attribute on "When Mary and John went to the store, John gave a drink to" (' Mary' is
                   the model's top prediction)
2. head split      every edge from a node at ' Mary' (position 1: its token, features, errors) into the ' Mary'
                   logit, split by the head of its last attention hop (graphs.split_heads); summed per head: the
                   heads that move the name
3. QK              for the top --heads heads at the last position: the score at ' Mary' versus the second ' John'
                   (position 9) and versus the pattern-weighted mean, split into pairs; the key-side terms that
                   make ' Mary' win
4. validation      the --validate strongest terms of each side removed from the residual the head reads, in the real
                   model: measured score and pattern beside the frozen model's prediction; their correlation
"""

import argparse
import json
import sys
from pathlib import Path

import torch

PROMPT = "When Mary and John went to the store, John gave a drink to"
NAME, OTHER = 1, 9  # ' Mary', the second ' John'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transcoders", type=Path, required=True)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--validate", type=int, default=5)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for every figure printed")
    args = parser.parse_args()

    import resid
    import resid.dictionaries
    from resid.analyses import graphs
    from resid.analyses.graphs.qk import QK

    model = resid.load("smollm2-135m")
    found = resid.dictionaries.load(args.transcoders, model)
    transcoders = found if isinstance(found, list) else [found]
    tokens = model.to_str_tokens(PROMPT)
    graph = graphs.attribute(model, PROMPT, transcoders)
    replacement, completeness = graph.scores()
    print(f"{len(tokens)} tokens; ' Mary' at {NAME}, ' John' at 3 and {OTHER}; top prediction "
          f"{graph.logit_strs[0]!r} p={float(graph.logit_probabilities[0]):.3f}; {graph.n_features} features; "
          f"replacement {replacement:.3f} completeness {completeness:.3f}")
    report: dict = {"prompt": PROMPT, "replacement": replacement, "completeness": completeness}

    sites = graph.sites()
    j = graph.logit_strs.index(" Mary")
    logit, logit_row = graph.n_nodes - graph.n_logits + j, graph.n_features + j  # its node, its row of graph.rows
    sources = [i for i, s in enumerate(sites) if s.positions == (NAME,) and s.part != "logits"
               and float(graph.rows[logit_row, i]) != 0]
    split = graphs.split_heads(model, graph, transcoders, edges=[(s, logit) for s in sources])
    parts = split.to_frame()
    by_head = parts.groupby("via")["weight"].sum().sort_values(key=lambda v: -v.abs())
    total = float(graph.rows[logit_row, sources].double().sum())
    print(f"edges from the {len(sources)} nodes at ' Mary' into the ' Mary' logit: {total:+.3f}, by the head of "
          "their last hop:")
    for via, weight in by_head.head(8).items():
        print(f"  {via:<28} {weight:+8.3f}")
    report["name_to_logit"] = {"total": total, "by_head": {k: float(v) for k, v in by_head.head(12).items()}}

    qk = QK(model, PROMPT, transcoders)
    heads = [resid.Site.parse(v) for v in by_head.index if v != "residual"][:args.heads]
    report["heads"] = []
    for head in heads:
        entry = {"head": head.label}
        for versus in (OTHER, "mean"):
            result = qk.score(head.layer, head.head, query=-1, key=NAME, versus=versus)
            name = "versus_john" if versus == OTHER else "versus_mean"
            pairs, keys = result.top(args.top), result.key_marginal().head(args.top)
            queries = result.query_marginal().head(args.top)
            print(f"{head.label}: pattern at ' Mary' {result.pattern[NAME]:.3f}"
                  + (f", at ' John'({OTHER}) {result.pattern[OTHER]:.3f}" if versus == OTHER else "")
                  + f"; score(' Mary') - {'score(John)' if versus == OTHER else 'mean score'} = {result.raw:+.3f} "
                  f"(run: {result.run_raw:+.3f})")
            print("  key-side terms:   " + "; ".join(f"{r.site} {r.value:+.3f}" for r in keys.itertuples()))
            print("  query-side terms: " + "; ".join(f"{r.site} {r.value:+.3f}" for r in queries.itertuples()))
            print("  top pairs:        " + "; ".join(f"{r.query} x {r.key} {r.value:+.3f}" for r in pairs.itertuples()))
            every = result.key_marginal()
            features = every[[resid.Site.parse(label).feature is not None for label in every["site"]]].head(args.top)
            print("  key-side features: " + "; ".join(f"{r.site} {r.value:+.3f}" for r in features.itertuples()))
            kinds = every.assign(kind=[_kind(label) for label in every["site"]]).groupby("kind")["value"].sum()
            print("  key side by kind:  " + "; ".join(f"{k} {v:+.3f}" for k, v in kinds.items()))
            entry[name] = {"raw": result.raw, "run_raw": result.run_raw, "pattern": result.pattern,
                           "key_terms": keys.to_dict("records"), "query_terms": queries.to_dict("records"),
                           "pairs": pairs.to_dict("records"), "key_features": features.to_dict("records"),
                           "key_by_kind": {k: float(v) for k, v in kinds.items()}}
        result = qk.score(head.layer, head.head, query=-1, key=NAME)
        check = qk.validate(result, top=args.validate)
        corr_score = float(torch.corrcoef(torch.tensor([check["predicted_score"].to_list(),
                                                        check["measured_score"].to_list()]))[0, 1])
        corr_pattern = float(torch.corrcoef(torch.tensor([check["predicted_pattern"].to_list(),
                                                          check["measured_pattern"].to_list()]))[0, 1])
        print(f"  validation ({len(check)} terms removed in the real model): score predicted vs measured "
              f"correlation {corr_score:.3f}, pattern {corr_pattern:.3f}; median |error| score "
              f"{float((check['predicted_score'] - check['measured_score']).abs().median()):.3f}")
        print(check.to_string(index=False))
        entry["validation"] = {"score_correlation": corr_score, "pattern_correlation": corr_pattern,
                               "rows": check.to_dict("records"), "score": result.run_scores[NAME]}
        report["heads"].append(entry)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1, default=float) + "\n")
        print(f"wrote {args.out}")


def _kind(label: str) -> str:
    """A term's kind: feature, error, head (an earlier head's write), embed, or constant (biases, skip paths)."""
    import resid

    site = resid.Site.parse(label)
    if site.feature is not None:
        return "feature"
    if site.head is not None:
        return "head"
    if site.what == "error":
        return "error"
    return "embed" if site.part in ("embed", "pos_embed") else "constant"


if __name__ == "__main__":
    sys.exit(main())
