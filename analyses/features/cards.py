"""A dictionary feature's card (plotly): what activates it and what it writes, in one figure.

    table = features.top_activating(model, sae, corpus.demo(), features=[3, 7])
    fig = features.card(model, sae, 3, table)
    plots.save_html(fig, "feature_3.html")          (resid.analyses.plots; self_contained=False shares plotly.js)

Top: the feature's top-activating contexts (features.top_activating), the activating token in bold and coloured,
each activation's cell shaded by its share of the largest shown.
Bottom left: its activation histogram over every scanned token (the table's `attrs["histogram"]`,
resid.analyses.features.histogram): the tokens where it is off (0) and its geometric bins, on a log count axis, a
few bins named on the axis by their lower edge (every bin's range in its hover text).
Bottom right: the tokens its decoder direction promotes and suppresses most, read through the unembedding with the
final norm's gain folded in (features.views.decoder_top_tokens).
"""

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from resid.analyses.features.examples import select_features
from resid.analyses.features.histogram import SIDE, ZERO, edges
from resid.analyses.features.views import decoder_top_tokens
from resid.analyses.neurons.keys import MARK
from resid.analyses.neurons.plots import add_bars
from resid.dictionaries import Dictionary, feature_site
from resid.errors import ResidError
from resid.model import Transformer

HIGHLIGHT = "#b2182b"
TICKS = 6  # histogram bins named on the axis (the rest by hovering): 40 rotated range labels were unreadable
OFF, ACTIVE = "#999999", "#2166ac"


def card(model: Transformer, dictionary: Dictionary, feature: int, table: pd.DataFrame, k: int = 10,
         examples: int = 20, histogram: pd.DataFrame | None = None, through_final_norm: bool = True) -> go.Figure:
    """Feature `feature` of `dictionary`: its top `examples` contexts from `table` (features.top_activating's frame),
    its activation histogram (`histogram`, default `table.attrs["histogram"]`) and its k most promoted and
    suppressed tokens (see the module docstring)."""
    select_features(dictionary, feature)
    counts = _histogram(dictionary, feature, table, histogram)
    rows = table[(table["dictionary"] == dictionary.name) & (table["feature"] == feature)].sort_values("rank")
    _finite(rows, "activation", f"The table's rows of feature {feature}")
    tokens = decoder_top_tokens(model, dictionary, feature, k=k, through_final_norm=through_final_norm)
    fig = make_subplots(
        rows=2, cols=2, row_heights=[0.5, 0.5], column_widths=[0.55, 0.45], vertical_spacing=0.12,
        specs=[[{"type": "table", "colspan": 2}, None], [{"type": "xy"}, {"type": "xy"}]],
        subplot_titles=("top-activating contexts", "activation histogram (all scanned tokens)",
                        "decoder direction: promoted / suppressed tokens"),
    )
    fig.add_trace(_contexts(rows.head(examples)), row=1, col=1)
    traces = _bins(counts)
    for trace in traces:
        fig.add_trace(trace, row=2, col=1)
    add_bars(fig, tokens, row=2, col=2)
    fig.update_yaxes(type="log", title_text="tokens", row=2, col=1)
    shown = [x for trace in traces for x in trace.x]  # every bin's full range stays in its hover text
    ticks = _ticks(shown)
    fig.update_xaxes(title_text="activation (bin's lower edge; hover a bar for its range)", type="category",
                     tickvals=ticks, ticktext=[_short(label) for label in ticks], tickangle=0, row=2, col=1)
    fig.update_yaxes(autorange="reversed", row=2, col=2)
    fig.update_xaxes(title_text="logit added by the decoder direction", row=2, col=2)
    total = int(counts["count"].sum())
    off = int(counts.loc[(counts["low"] == 0) & (counts["high"] == 0), "count"].sum())
    peak = f", max {rows['activation'].iloc[0]:.3g}" if len(rows) else ""
    fig.update_layout(
        title=f"{feature_site(dictionary, feature).label} ({dictionary.name}): active on {total - off} of {total} "
              f"scanned tokens ({(total - off) / max(total, 1):.2%}){peak}",
        barmode="overlay", height=max(800, 22 * min(len(rows), examples) + 2 * 24 * k + 250), showlegend=False,
    )
    return fig


def _histogram(d: Dictionary, feature: int, table: pd.DataFrame, histogram: pd.DataFrame | None) -> pd.DataFrame:
    found = histogram if histogram is not None else table.attrs.get("histogram")
    if found is None:
        raise ResidError("The table has no activation histogram (attrs['histogram']): pass the frame "
                         "features.top_activating returned (a table read back from a file has lost it), or its "
                         "histogram as histogram=.")
    rows = found[(found["dictionary"] == d.name) & (found["feature"] == feature)]
    if rows.empty:
        scanned = sorted(set(zip(found["dictionary"], found["feature"])))[:10]
        raise ResidError(f"Feature {feature} of dictionary {d.name!r} was not scanned: the table has (dictionary, "
                         f"feature) pairs such as {scanned}. Run features.top_activating for it.")
    what = f"The activation histogram of feature {feature}"
    _finite(rows, "count", what)
    low, high = edges()
    known = set(zip(low.tolist(), high.tolist()))
    odd = [(a, b) for a, b in zip(rows["low"].tolist(), rows["high"].tolist()) if (a, b) not in known]
    if odd or (rows["count"] < 0).any() or (rows["count"] % 1 != 0).any():
        raise ResidError(f"{what}: rows that are not counts of its fixed bins (e.g. low, high = "
                         f"{odd[0] if odd else 'a negative or fractional count'}): it was edited or damaged. Pass "
                         "the histogram features.top_activating made.")
    return rows


def _finite(rows: pd.DataFrame, column: str, what: str) -> None:
    """Refuse NaN or infinite values in `column`, which a card would draw as nothing (or fail on)."""
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ResidError(f"{what}: {bad.size} non-finite {column} value(s) (e.g. {rows[column].tolist()[bad[0]]!r:.40}"
                         f"); a card shows numbers only. Pass the frame features.top_activating returned (a table "
                         "edited or read back damaged has lost them).")


def _bins(counts: pd.DataFrame) -> list[go.Bar]:
    """The zero bin (grey) and every bin between the lowest and highest non-empty one (blue), in order."""
    low, high = edges()
    full = np.zeros(len(low), dtype=np.int64)
    index = {(a, b): i for i, (a, b) in enumerate(zip(low, high))}
    for row in counts.itertuples():
        full[index[(row.low, row.high)]] += row.count
    used = np.flatnonzero(full)
    labels = ["0 (off)" if i == ZERO else _range(low[i], high[i], i, SIDE) for i in range(len(low))]
    span = range(used.min(), used.max() + 1)
    active = [i for i in span if i != ZERO]
    traces = [go.Bar(x=[labels[ZERO]], y=[int(full[ZERO])], name="off", marker_color=OFF,
                     hovertemplate="off (0): %{y} tokens<extra></extra>")] if full[ZERO] else []
    return traces + [go.Bar(x=[labels[i] for i in active], y=[int(full[i]) for i in active], name="active",
                            marker_color=ACTIVE, hovertemplate="%{x}: %{y} tokens<extra></extra>")]


def _ticks(labels: list[str], most: int = TICKS) -> list[str]:
    """At most `most` of the bins' labels to name on the axis, evenly spaced, the first and last among them."""
    if len(labels) <= most:
        return labels
    step = (len(labels) - 1) / (most - 1)
    return [labels[round(i * step)] for i in range(most)]


def _short(label: str) -> str:
    """A bin's label on the axis: its lower edge in 2 significant digits ("0" for the off bin)."""
    if label.startswith("0 (off)"):
        return "0"
    if label.startswith(("<", ">=")):
        return label.split()[0] + f"{float(label.split()[1]):.2g}"
    return f"{float(label[1:].split(',')[0]):.2g}"


def _range(low: float, high: float, index: int, side: int) -> str:
    if index < side:  # a negative bin
        return f"[{low:.3g}, {high:.3g}]" if np.isfinite(low) else f"< {high:.3g}"
    return f"[{low:.3g}, {high:.3g})" if np.isfinite(high) else f">= {low:.3g}"


def _contexts(rows: pd.DataFrame) -> go.Table:
    if rows.empty:
        return go.Table(header={"values": ["rank", "activation", "context"]},
                        cells={"values": [[""], [""], ["(no scanned token activates this feature)"]]})
    peak = float(rows["activation"].abs().max()) or 1.0
    return go.Table(
        columnwidth=[0.6, 1.2, 10],
        header={"values": ["rank", "activation", "context"], "align": "left"},
        cells={"values": [rows["rank"], rows["activation"].map("{:.3f}".format),
                          [highlight(c) for c in rows["context"]]], "align": "left",
               "fill": {"color": [["white"] * len(rows), [_shade(a, peak) for a in rows["activation"]],
                                  ["white"] * len(rows)]}},
    )


def _shade(activation: float, peak: float) -> str:
    """The activation cell's colour: the highlight's red, its opacity the activation's share of the largest shown."""
    return f"rgba(178, 24, 43, {0.6 * min(abs(float(activation)) / peak, 1.0):.3f})"


def highlight(context: str) -> str:
    """A context of top_activating (its trigger marked ⟦ ⟧) as the HTML plotly draws, the trigger bold and coloured;
    the text itself escaped, so that a token like "<b>" shows as written."""
    before, rest = context.split(MARK[0], 1)
    token, after = rest.rsplit(MARK[1], 1)
    return (f"{_visible(before)}<b><span style='color:{HIGHLIGHT}'>{_visible(token)}</span></b>"
            f"{_visible(after)}")


def _visible(text: str) -> str:
    return html.escape(text).replace("\n", "⏎")
