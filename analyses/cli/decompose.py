"""`resid decompose "prompt"`: where a prediction comes from. The top next tokens, a compact logit lens, the
components with the largest direct attribution, and a completeness check (components sum to the logit).
Masked-LM models (BERT) decompose the prediction at the prompt's [MASK] instead of the next token:
`resid decompose "Paris is the [MASK] of France." --model bert-folder`.
With --out DIR: the full tables (CSV, LaTeX, each with a provenance sidecar) and report.html, a page of three
sections (prediction, logit lens, direct attribution), each its table and figures (resid.analyses.report)."""

from pathlib import Path

from resid.analyses.cli import arguments, output, sources


def add_parser(commands, common) -> None:
    parser = commands.add_parser("decompose", parents=[common], help="decompose a prediction: lens + attribution")
    parser.add_argument("text",
                        help="the prompt whose next-token prediction (masked-LM models: the [MASK]) is decomposed")
    parser.add_argument("--target", default=None, help="target token, e.g. ' Paris' (default: the top prediction)")
    parser.add_argument("--baseline", default=None, help="attribute logit(target) - logit(baseline)")
    parser.add_argument("--top", type=int, default=10, help="how many tokens and components to list (default 10)")
    parser.add_argument("--level", default="head", choices=["sublayer", "head", "neuron"],
                        help="attribution detail: heads + MLPs (default), sublayers, or heads + neurons")
    parser.add_argument("--norm", default="recompute", choices=["recompute", "frozen"], help="logit-lens final norm")
    parser.add_argument("--out", default=None, help="a folder: the tables (CSV, LaTeX) and report.html go in it")
    arguments.self_contained(parser)
    sources.add_source(parser)


def check(args) -> None:
    arguments.at_least(args.top, 1, "--top")
    arguments.out_folder(args.out)


def run(model, args) -> str:
    from resid.analyses import attribution, logit_lens
    from resid.analyses.lenses import LogitLens
    from resid.seq2seq import EncoderDecoder

    text, source = sources.split(model, args.text, args.source)  # encoder-decoder: the target prefix's ids
    attr = attribution.direct(model, text, targets=args.target, baselines=args.baseline, level=args.level,
                              source=source)
    at = int(attr["pos"].iloc[0])  # the last token, or the [MASK] of a masked-LM model
    # Every position for the heatmap; the table reads the attributed one.
    read = LogitLens(model.decoder if isinstance(model, EncoderDecoder) else model, frozen_norm=args.norm == "frozen")
    lens = logit_lens.run(model, text, targets=args.target, positions="all", every="layer", k=args.top, lens=read,
                          source=source)
    lines = _predictions(model, text, lens, at)
    lines[0] += sources.shown(model, source)
    lines += _lens_table(lens, at, f"the [MASK] (position {at})" if model.config.head == "mlm" else "the last token")
    lines += _components(attr, args.top)
    notes = output.notes(lens, attr)
    lines += ([""] + notes) if notes else []
    if args.out is not None:
        lines += _write(model, args.text, lens, attr, at, Path(args.out), args)
    return "\n".join(lines)


def _final(model, lens, at: int):
    # The lens's last site at the attributed token is the model's own prediction there (tested exact).
    from resid.sites import Site

    return lens[(lens["pos"] == at) & (lens["site"] == Site(model.config.n_layers - 1, "resid_post").label)]


def _predictions(model, text, lens, at: int) -> list[str]:
    final = _final(model, lens, at)
    pieces = sources.pieces(model, text)
    what = f"top predictions for {pieces[at]!r} (position {at})" if model.config.head == "mlm" else "top next tokens"
    lines = [f"model: {model.name}   prompt: {len(pieces)} tokens {pieces}", "", f"{what}:"]
    lines += [f"  {p:7.4f}  {token!r}" for p, token in zip(final["prob"], final["token"])]
    return lines


def _lens_table(lens, at: int, where: str) -> list[str]:
    top = lens[(lens["rank"] == 1) & (lens["pos"] == at)]
    target = top["target"].iloc[0]
    lines = ["", f"logit lens at {where} ({top['norm'].iloc[0]} final norm), target {target!r}:",
             f"  {'layer':<6} {'top token':<16} {'p(top)':>9} {'p(target)':>9} {'rank':>6}"]
    for _, row in top.iterrows():
        layer = "embed" if row["site"] == "layers[0].resid_pre" else str(row["layer"])  # the stream's start
        lines.append(f"  {layer:<6} {row['token']!r:<16} {output.prob(row['prob'])} {output.prob(row['target_prob'])} "
                     f"{row['target_rank']:>6}")
    return lines


def _components(attr, top: int) -> list[str]:
    from resid.analyses.attribution import metric_name, top_components

    first, metric = attr.iloc[0], metric_name(attr)
    ranked = top_components(attr, top)
    lines = ["", f"top {len(ranked)} components by direct attribution to {metric}:"]
    lines += [f"  {row['value']:+9.4f}  {row['site']}" for _, row in ranked.iterrows()]
    total, actual = attr["value"].sum(), first["logit"]
    lines += ["", (f"completeness: sum of {len(attr)} components = {total:.6f}; model {metric} = {actual:.6f}; "
                   f"difference {total - actual:+.2e}")]
    return lines


def _write(model, text: str, lens, attr, at: int, out: Path, args) -> list[str]:
    from resid.analyses import attribution, report, tables

    # CSV: the full tables. LaTeX: what fits a paper, the top components and the lens's top-1 per layer.
    ranked = attribution.top_components(attr, 20)
    lens_top = lens[(lens["rank"] == 1) & (lens["pos"] == at)]
    files = [
        tables.export(attr, out / "attribution.csv"),
        tables.export(ranked[["site", "layer", "part", "head", "value"]], out / "attribution.tex",
                      attr.attrs.get("provenance")),
        tables.export(lens, out / "logit_lens.csv"),
        tables.export(lens_top[["layer", "site", "token", "prob", "target_prob", "target_rank"]],
                      out / "logit_lens.tex", lens.attrs.get("provenance")),
    ]
    page = _report(model, text, lens, attr, at, args.top, args.level)
    files.append(report.write(page, out / "report.html", args.self_contained))
    return ["", "wrote " + ", ".join(str(f) for f in files)]


def _report(model, text: str, lens, attr, at: int, top: int, level: str):
    """report.html: the printed summary's three parts as sections, each a table and its figures."""
    import pandas as pd

    from resid.analyses import plots, report
    from resid.analyses.attribution import metric_name, top_components

    metric, mlm = metric_name(attr), model.config.head == "mlm"
    where = f"the [MASK] (position {at})" if mlm else "the last token"
    final = _final(model, lens, at)
    prediction = pd.DataFrame({"rank": final["rank"], "token": final["token"].map(repr), "probability": final["prob"]})
    rows = lens[(lens["rank"] == 1) & (lens["pos"] == at)]
    per_layer = pd.DataFrame({
        "layer": ["embed" if site == "layers[0].resid_pre" else str(layer) for site, layer in zip(rows["site"],
                                                                                              rows["layer"])],
        "top token": rows["token"].map(repr), "p(top)": rows["prob"], "p(target)": rows["target_prob"],
        "target rank": rows["target_rank"]})
    ranked = top_components(attr, len(attr))  # every row, largest first: the page shows the top ones
    components = pd.DataFrame({"site": ranked["site"], "direct attribution": ranked["value"]})
    total, actual = float(attr["value"].sum()), float(attr["logit"].iloc[0])
    probs = {c: "{:.3g}" for c in ("probability", "p(top)", "p(target)")}
    sections = [
        report.Section("Prediction", [
            f"The model's top predictions for {where}, with their probabilities." if mlm else
            "The model's top next tokens after the prompt, with their probabilities.",
            report.Table(prediction, formats=probs)]),
        report.Section("Logit lens", [
            f"The residual stream at {where} read through the final norm ({rows['norm'].iloc[0]}) and the "
            f"unembedding after each layer: each row is a layer's top token and its probability, and the probability "
            f"and rank there of the target {rows['target'].iloc[0]!r}.",
            report.Table(per_layer, rows=len(per_layer), formats=probs),
            plots.logit_lens_heatmap(lens)]),
        report.Section("Direct attribution", [
            f"The {min(top, len(components))} components whose writes move {metric} at {where} most, largest "
            "magnitude first: each row "
            "is one write's projection onto the metric's direction through the final norm (its scale frozen).",
            report.Table(components, signed=("direct attribution",), rows=top, full="attribution.csv"),
            f"Completeness: the {len(attr)} components of the table sum to {total:.6f} and the model's {metric} is "
            f"{actual:.6f}, a difference of {total - actual:+.2e} (a complete decomposition differs by float "
            "rounding only).",
            plots.layer_attribution_bars(attr),
            *([plots.head_attribution_heatmap(attr)] if attr["head"].notna().any() else [])]),
    ]
    notes = output.notes(lens, attr)
    if notes:
        sections.append(report.Section("Notes", [note.removeprefix("note: ") for note in notes]))
    measured = f"{metric} at {where}, by the logit lens and direct attribution ({level} level)"
    return report.Page(f"resid decompose: {text!r}", report.context(model, measured, [text]), sections)
