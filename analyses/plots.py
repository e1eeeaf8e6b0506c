"""Figures (plotly), kept apart from the analyses that produce the DataFrames they draw. `save_html` writes a page
that opens offline (plotly.js embedded); `save_image` a PNG, PDF or SVG, which needs the extra
`pip install 'resid-stream[figures]'` (kaleido). A page of several figures with headings and tables is a
resid.analyses.report Page."""

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from resid.analyses.attribution import metric_name
from resid.analyses.lenses.lens import short_label
from resid.errors import ResidError
from resid.sites import Site


def ablation_effects(df: pd.DataFrame) -> go.Figure:
    """Mean change of the metric per ablated site across prompts (error bars: standard error).
    Head sweeps become a layer x head heatmap; layer / sublayer sweeps a line per part."""
    if df.empty:
        raise ResidError("The ablation results are empty: nothing to plot.")
    method, metric = df["method"].iloc[0], df["metric"].iloc[0]
    df, name = _stacks(df)
    title = f"{method}-ablation effect on {metric} (mean over {df['prompt_idx'].nunique()} prompts)"
    heads = df[df["head"].notna()]
    if not heads.empty:
        grid = heads.groupby(["layer", "head"])["delta"].mean().unstack("head")
        fig = go.Figure(go.Heatmap(
            z=grid.values, x=[f"H{h}" for h in grid.columns], y=[name(l) for l in grid.index],
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


def patching_heatmap(df: pd.DataFrame) -> go.Figure:
    """The mean normalized score over pairs (resid.analyses.patching; 0 = corrupt run, 1 = clean run): layer x position
    for the residual stream, layer x head for heads, a line per part for sublayer writes."""
    if df.empty:
        raise ResidError("The patching results are empty: nothing to plot.")
    title = (f"{df['direction'].iloc[0]} patching, {df['metric'].iloc[0]}: mean score over "
             f"{df['prompt_idx'].nunique()} pairs (0 = corrupt, 1 = clean)")
    df, name = _stacks(df)
    for kind, axis in (("position", "position"), ("head", "head"), ("kv_head", "key/value head")):
        rows = df[df[kind].notna()]
        if not rows.empty:
            grid = rows.groupby(["layer", kind])["score"].mean().unstack(kind)
            fig = go.Figure(go.Heatmap(
                z=grid.values, x=[str(c) for c in grid.columns], y=[name(l) for l in grid.index], colorscale="RdBu",
                zmid=0, colorbar=dict(title="score"),
                hovertemplate=f"layer %{{y}} {axis} %{{x}}<br>score %{{z:.3f}}<extra></extra>",
            ))
            fig.update_layout(title=title, xaxis_title=axis, yaxis_title="layer")
            return fig
    fig = go.Figure()
    for part, rows in df.groupby("part", sort=False):
        means = rows.groupby("layer")["score"].mean()
        fig.add_trace(go.Scatter(x=means.index, y=means.values, mode="lines+markers", name=part))
    fig.update_layout(title=title, xaxis_title="layer", yaxis_title="score")
    return fig


def _stacks(df: pd.DataFrame) -> tuple[pd.DataFrame, Callable[[int], str]]:
    """Encoder-decoder results (sites "encoder.<label>"): the encoder's layers keyed before the decoder's (-n..-1)
    and its parts named "encoder <part>", with each key's axis label (E0.. the encoder's, L0.. the decoder's)."""
    encoder = df["site"].astype(str).str.startswith("encoder.")
    if not encoder.any():
        return df, lambda layer: f"L{layer}"
    n = int(df.loc[encoder, "layer"].max()) + 1
    stacked = df.assign(layer=df["layer"].where(~encoder, df["layer"] - n),
                        part=df["part"].where(~encoder, "encoder " + df["part"].astype(str)))
    return stacked, lambda layer: f"E{layer + n}" if layer < 0 else f"L{layer}"


def save_html(fig: go.Figure, path: str | Path, self_contained: bool = True) -> Path:
    """An HTML file that opens offline: plotly.js (4.8 MB) embedded, or with self_contained=False a script tag
    for the plotly.min.js written once beside it, which every page in that folder shares."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True if self_contained else "directory", full_html=True)
    return path


IMAGES = (".png", ".pdf", ".svg", ".jpeg", ".jpg", ".webp")


def save_image(fig: go.Figure, path: str | Path, scale: float = 2.0) -> Path:
    """A static image of `fig` (PNG, PDF, SVG, ... by the suffix; `scale` multiplies a raster image's pixels),
    through kaleido: the extra resid-stream[figures]."""
    path = Path(path)
    if path.suffix.lower() not in IMAGES:
        raise ResidError(f"Cannot save a figure as {path.name!r}: give a name ending in one of {', '.join(IMAGES)} "
                         "(or use save_html for a page).")
    if importlib.util.find_spec("kaleido") is None:
        raise ResidError(f"Saving {path.name} needs kaleido, which draws plotly figures as images: pip install "
                         "'resid-stream[figures]' (HTML pages, save_html, need nothing more).")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_image(path, scale=scale)
    return path


def _visible(token: str) -> str:
    """Cell text for a token: escapes shown (\\n), and a whitespace-only token as one ␣ per character."""
    return "␣" * len(token) if token.isspace() else repr(token)[1:-1]


def logit_lens_heatmap(df: pd.DataFrame, prompt_idx: int = 0) -> go.Figure:
    """Sites (layers) x positions of one prompt from logit_lens.run: cell text = the lens's top token, colour
    = the target's probability, hover = the top-k tokens with probabilities."""
    rows = df[df["prompt_idx"] == prompt_idx]
    if rows.empty:
        raise ResidError(f"The logit-lens table has no rows for prompt_idx={prompt_idx}.")
    cells = rows.groupby(["pos", "site"], sort=False)
    positions = list(dict.fromkeys(rows["pos"]))
    sites = list(dict.fromkeys(rows["site"]))
    z = [[None] * len(positions) for _ in sites]
    text = [[""] * len(positions) for _ in sites]
    hover = [[""] * len(positions) for _ in sites]
    for (pos, site), cell in cells:
        i, j = sites.index(site), positions.index(pos)
        first = cell.iloc[0]
        z[i][j] = first["target_prob"]
        text[i][j] = _visible(first["token"])
        top = "<br>".join(f"{r['rank']}. {r['token']!r} {r['prob']:.3f}" for _, r in cell.iterrows())
        hover[i][j] = (f"{short_label(Site.parse(site))}, pos {pos} ({first['input']!r})<br>{top}<br>"
                       f"target {first['target']!r}: p={first['target_prob']:.3g}, rank {first['target_rank']}")
    inputs = rows.drop_duplicates("pos").set_index("pos")["input"]
    targets = rows["target"].unique()
    target = repr(targets[0]) if len(targets) == 1 else "the final top token"
    fig = go.Figure(go.Heatmap(
        z=z, x=[f"{p}: {inputs[p]!r}" for p in positions], y=[short_label(Site.parse(s)) for s in sites],
        text=text, texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        colorscale="Blues", zmin=0, zmax=1, colorbar=dict(title="p(target)"),
    ))
    fig.update_layout(
        title=f"{str(rows['lens'].iloc[0]).capitalize() if 'lens' in rows else 'Logit'} lens ({rows['norm'].iloc[0]} "
              f"final norm): top token per site, colour = p({target})",
        xaxis_title="position: input token", yaxis_title="site", height=max(400, 18 * len(sites) + 150),
    )
    return fig


def head_attribution_heatmap(df: pd.DataFrame, prompt_idx: int | None = None) -> go.Figure:
    """Layer x head direct attribution from attribution.direct(level="head" or "neuron"): one prompt, or the
    mean over prompts when prompt_idx is None."""
    heads = df[df["head"].notna()]
    if heads.empty:
        raise ResidError("The attribution table has no per-head rows: run attribution.direct(level='head').")
    if prompt_idx is not None:
        heads = heads[heads["prompt_idx"] == prompt_idx]
    grid = heads.groupby(["layer", "head"])["value"].mean().unstack("head")
    what = f"prompt {prompt_idx}" if prompt_idx is not None else f"mean over {heads['prompt_idx'].nunique()} prompts"
    fig = go.Figure(go.Heatmap(
        z=grid.values, x=[f"H{h}" for h in grid.columns], y=[f"L{l}" for l in grid.index],
        colorscale="RdBu", zmid=0, colorbar=dict(title="logit"),
        hovertemplate="layer %{y} head %{x}<br>%{z:+.4f} logit<extra></extra>",
    ))
    fig.update_layout(title=f"Direct attribution per head to {metric_name(df)} ({what})",
                      xaxis_title="head", yaxis_title="layer", height=max(400, 16 * len(grid) + 150))
    return fig


def layer_attribution_bars(df: pd.DataFrame, prompt_idx: int | None = None) -> go.Figure:
    """Per layer, the direct attribution of attention and of the MLP (any level, summed), side by side."""
    rows = df if prompt_idx is None else df[df["prompt_idx"] == prompt_idx]
    n_prompts = rows["prompt_idx"].nunique()
    layers = rows[rows["layer"].notna()]
    sums = layers.groupby(["layer", "part"])["value"].sum().unstack("part").fillna(0) / n_prompts
    other = rows[rows["layer"].isna()].groupby("site")["value"].sum() / n_prompts
    fig = go.Figure([
        go.Bar(x=sums.index, y=sums[part], name=part, hovertemplate=f"{part} L%{{x}}: %{{y:+.4f}}<extra></extra>")
        for part in ("attn", "mlp") if part in sums
    ])
    extras = ", ".join(f"{name} {value:+.3f}" for name, value in other.items())
    what = f"prompt {prompt_idx}" if prompt_idx is not None else f"mean over {n_prompts} prompts"
    fig.update_layout(barmode="group", title=f"Direct attribution per layer to {metric_name(df)} ({what}); {extras}",
                      xaxis_title="layer", yaxis_title="logit")
    return fig
