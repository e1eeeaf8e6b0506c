"""Figures (plotly) of FFN neurons as key-value memories (Geva et al. 2021, 2022), drawn from the
DataFrames of resid.analyses.neurons:

    value_bars(values_df, layer, neuron)        the value's top and bottom tokens (horizontal bars)
    context_table(contexts_df, layer, neuron)   its top-activating contexts, the trigger marked ⟦ ⟧
    neuron_card(values_df, contexts_df, layer, neuron)   both side by side
    plots.save_html(fig, "neuron.html")         (resid.analyses.plots) a self-contained HTML file; with
                                                self_contained=False, pages sharing one plotly.min.js

Glossary: a neuron's *value* W_out[i] read through the unembedding gives its token logits (value_top_tokens);
its *contexts* are the corpus tokens with the largest coefficients m_i (top_activating).
"""

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from resid.errors import ResidError

COLORS = {"top": "#2166ac", "bottom": "#b2182b"}


def value_bars(values: pd.DataFrame, layer: int, neuron: int) -> go.Figure:
    """The neuron's top tokens (blue, positive logits) and bottom tokens (red), strongest at the top."""
    fig = go.Figure()
    add_bars(fig, _rows(values, layer, neuron, "value_top_tokens"))
    fig.update_layout(
        title=f"L{layer} N{neuron}: value tokens", xaxis_title="logit added by the value", barmode="overlay",
        yaxis={"autorange": "reversed"}, height=_height(values, layer, neuron),
    )
    return fig


def context_table(contexts: pd.DataFrame, layer: int, neuron: int) -> go.Figure:
    """The neuron's top-activating contexts, one row per rank: coefficient, trigger token, context."""
    fig = go.Figure(_table(_rows(contexts, layer, neuron, "top_activating")))
    fig.update_layout(title=f"L{layer} N{neuron}: top-activating contexts")
    return fig


def neuron_card(values: pd.DataFrame, contexts: pd.DataFrame, layer: int, neuron: int) -> go.Figure:
    """Value tokens (left) and top-activating contexts (right) of one neuron in one figure."""
    value_rows = _rows(values, layer, neuron, "value_top_tokens")
    context_rows = _rows(contexts, layer, neuron, "top_activating")
    fig = make_subplots(
        rows=1, cols=2, column_widths=[0.3, 0.7], specs=[[{"type": "xy"}, {"type": "table"}]],
        subplot_titles=("value: top / bottom tokens", "key: top-activating contexts"),
    )
    add_bars(fig, value_rows, row=1, col=1)
    fig.add_trace(_table(context_rows), row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="logit added by the value", row=1, col=1)
    fig.update_layout(title=f"Layer {layer}, neuron {neuron}", barmode="overlay",
                      height=_height(values, layer, neuron))
    return fig


def _rows(df: pd.DataFrame, layer: int, neuron: int, source: str) -> pd.DataFrame:
    if df.empty:
        raise ResidError(f"The {source} table is empty: nothing to plot.")
    rows = df[(df["layer"] == layer) & (df["neuron"] == neuron)]
    if "expert" in df and rows["expert"].nunique() > 1:
        raise ResidError(
            f"The {source} table has neuron {neuron} of several experts of layer {layer} (a mixture of experts): "
            f"plot one expert's, e.g. df[df['expert'] == {int(rows['expert'].iloc[0])}]."
        )
    if rows.empty:
        shown = sorted(set(zip(df["layer"], df["neuron"])))[:10]
        raise ResidError(
            f"The {source} table has no rows for layer {layer}, neuron {neuron}; it has (layer, neuron) "
            f"pairs such as {shown}. Pick one of those, or run {source} for that neuron."
        )
    return rows


def add_bars(fig: go.Figure, rows: pd.DataFrame, **where) -> None:
    """A token table's top and bottom rows as horizontal bars on `fig` (at subplot `where`, e.g. row=1, col=2)."""
    for direction in ("top", "bottom"):
        part = rows[rows["direction"] == direction].sort_values("rank")
        if direction == "bottom":
            part = part.iloc[::-1]  # most negative last, at the bottom of the chart
        labels = [f"{t!r} ({i})" for t, i in zip(part["token"], part["token_id"])]
        fig.add_trace(go.Bar(
            x=part["value"], y=labels, orientation="h", name=direction, marker_color=COLORS[direction],
            hovertemplate="%{y}<br>logit %{x:.3f}<extra></extra>",
        ), **where)


def _table(rows: pd.DataFrame) -> go.Table:
    rows = rows.sort_values("rank")
    return go.Table(
        columnwidth=[0.6, 1.2, 1.6, 8],
        header={"values": ["rank", "coefficient", "trigger", "context"], "align": "left"},
        cells={
            "values": [rows["rank"], rows["coefficient"].map("{:.3f}".format), [repr(t) for t in rows["token"]],
                    rows["context"]],
            "align": "left",
        },
    )


def _height(values: pd.DataFrame, layer: int, neuron: int) -> int:
    n = int(((values["layer"] == layer) & (values["neuron"] == neuron)).sum())
    return max(400, 24 * n + 150)
