"""The evaluation of lenses as a figure (plotly): one panel per metric, the sites along x, a line per lens, as
tuned-lens's paper plots them (Belrose et al. 2023, figure 2)."""

import pandas as pd
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from resid.errors import ResidError

PANELS = (("kl", "KL(final || lens), nats"), ("ce", "cross-entropy, nats"), ("entropy", "entropy, nats"),
          ("top1", "top-1 agreement with the model"))


def evaluation(df: pd.DataFrame) -> go.Figure:
    """A 2 x 2 figure of resid.analyses.lenses.evaluation.evaluate's table."""
    if df.empty:
        raise ResidError("The lens evaluation is empty: nothing to plot.")
    fig = make_subplots(rows=2, cols=2, subplot_titles=[title for _, title in PANELS], vertical_spacing=0.2)
    labels = list(dict.fromkeys(df["label"]))
    palette = plotly.colors.qualitative.Plotly
    colors = {lens: palette[i % len(palette)] for i, lens in enumerate(dict.fromkeys(df["lens"]))}  # one per lens
    for i, (metric, title) in enumerate(PANELS):
        for lens, rows in df.groupby("lens", sort=False):
            fig.add_trace(go.Scatter(
                x=rows["label"], y=rows[metric], mode="lines+markers", name=f"{lens} lens", legendgroup=lens,
                line=dict(color=colors[lens]),
                showlegend=i == 0, hovertemplate=f"{lens} lens, %{{x}}<br>{title}: %{{y:.4g}}<extra></extra>",
            ), row=i // 2 + 1, col=i % 2 + 1)
    fig.update_xaxes(categoryorder="array", categoryarray=labels, tickangle=-60)
    tokens = int(df["tokens"].iloc[0])
    fig.update_layout(title=f"Lenses per site on held-out text ({tokens:,} tokens)", height=750)
    return fig
