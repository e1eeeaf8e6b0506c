"""Figures (plotly), kept apart from the analyses that produce the DataFrames they draw."""

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from resid.errors import ResidError


def ablation_effects(df: pd.DataFrame) -> go.Figure:
    """Mean change of the metric per ablated site across prompts (error bars: standard error).
    Head sweeps become a layer x head heatmap; layer / sublayer sweeps a line per part."""
    if df.empty:
        raise ResidError("The ablation results are empty: nothing to plot.")
    method, metric = df["method"].iloc[0], df["metric"].iloc[0]
    title = f"{method}-ablation effect on {metric} (mean over {df['prompt_idx'].nunique()} prompts)"
    heads = df[df["head"].notna()]
    if not heads.empty:
        grid = heads.groupby(["layer", "head"])["delta"].mean().unstack("head")
        fig = go.Figure(go.Heatmap(
            z=grid.values, x=[f"H{h}" for h in grid.columns], y=[f"L{l}" for l in grid.index],
            colorscale="RdBu", zmid=0, colorbar=dict(title="mean delta"),
            hovertemplate="layer %{y} head %{x}<br>mean delta %{z:.4f}<extra></extra>",
        ))
        fig.update_layout(title=title, xaxis_title="head", yaxis_title="layer")
        return fig
    fig = go.Figure()
    for part, rows in df[df["neuron"].isna()].groupby("part", sort=False):
        stats = rows.groupby("layer")["delta"].agg(["mean", "sem", "count"]).reset_index()
        fig.add_trace(go.Scatter(
            x=stats["layer"], y=stats["mean"], mode="lines+markers", name=part,
            error_y=dict(type="data", array=stats["sem"].fillna(0).values, visible=True),
            hovertemplate=f"{part} layer %{{x}}<br>mean delta %{{y:.4f}}<extra></extra>",
        ))
    fig.add_hline(y=0, line_color="grey", line_width=1)
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title=f"delta {metric}")
    return fig


def save_html(fig: go.Figure, path: str | Path) -> Path:
    """A self-contained HTML file (plotly.js embedded: opens offline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path
