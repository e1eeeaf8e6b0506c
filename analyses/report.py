"""A report page: one analysis run as one readable HTML page that opens offline.

    page = report.Page("resid decompose: 'The Eiffel Tower is in'", report.context(model, "logit(' Paris')", [text]),
                       [report.Section("Logit lens", ["At the last token ...", report.Table(df, signed=("value",)),
                                                      fig])])
    report.write(page, "report.html")                 # plotly.js embedded once; self_contained=False shares it

Glossary:
    page      a title (h1), a context line (model and its weights, the prompts, what was measured, resid's
              version) and sections, in order
    section   a heading (h2) and its parts in order: paragraphs (str, escaped), tables, plotly figures
    table     a DataFrame as an HTML table: a header row, at most `rows` rows (then "n more rows", naming the file
              that holds them all), numbers right-aligned and formatted (4 significant digits; signed columns with
              their sign, each cell tinted blue / red by its sign, its opacity its share of the column's largest
              magnitude, as feature cards shade activations)
    self-contained  plotly.js (4.8 MB) embedded once in the page's head; otherwise one plotly.min.js written
              beside the page, shared by every page in that folder (as plots.save_html's "directory" does)

The page's CSS is inline and it loads nothing from the network: it reads the same on a laptop offline.
"""

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from torch import nn

import resid
from resid.analyses.io import atomic
from resid.identities import identity

ROWS = 25  # table rows shown before "n more rows"
HEIGHT = 460  # px, a figure's height when its layout sets none (plotly's own default is 450 inside a sized box)
POSITIVE, NEGATIVE = (33, 102, 172), (178, 24, 43)  # the cards' blue and red (analyses/neurons/plots.py COLORS)
PLOTLY_JS = "plotly.min.js"

CSS = """
body { margin: 0; color: #1f2328; background: #fff;
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 1.6em; margin: 0.6em 0 0.2em; overflow-wrap: anywhere; }
h2 { font-size: 1.25em; margin: 1.6em 0 0.4em; padding-bottom: 0.2em; border-bottom: 1px solid #d0d7de; }
p.context { color: #57606a; margin: 0 0 1em; overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 14px; }
th { background: #f0f3f6; border-bottom: 2px solid #8c959f; text-align: left; padding: 4px 10px; }
td { padding: 3px 10px; border-bottom: 1px solid #eaeef2; white-space: pre-wrap; }
tbody tr:nth-child(even) { background: #f6f8fa; }
th.num, td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
p.more { color: #57606a; font-size: 13px; margin-top: 0; }
div.figure { width: 100%; margin: 0.8em 0; }
"""


@dataclass(frozen=True)
class Table:
    """`frame` shown as a table: its first `rows` rows (sort it first), `signed` columns tinted by sign, `full` the
    file holding every row (named under a cut table), `formats` a format spec per column ("{:.3g}") over the
    defaults."""

    frame: pd.DataFrame
    signed: Sequence[str] = ()
    rows: int = ROWS
    full: str | None = None
    formats: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    """A heading and its parts in order: a str is a paragraph, a Table a table, a plotly Figure a figure."""

    heading: str
    parts: Sequence[str | Table | go.Figure]


@dataclass(frozen=True)
class Page:
    title: str
    context: str
    sections: Sequence[Section]


def write(page: Page, path: str | Path, self_contained: bool = True) -> Path:
    """The page as an HTML file at `path`: plotly.js embedded once, or with self_contained=False loaded from a
    plotly.min.js written beside it (kept if already there)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not self_contained and not (path.parent / PLOTLY_JS).exists():
        (path.parent / PLOTLY_JS).write_text(get_plotlyjs(), encoding="utf-8")
    atomic.write(path, render(page, self_contained))  # a killed run leaves the old page, never half a new one
    return path


def render(page: Page, self_contained: bool = True) -> str:
    """The page's HTML text (see write); plotly.js is loaded only when the page has a figure."""
    figures = any(isinstance(part, go.Figure) for section in page.sections for part in section.parts)
    script = ""
    if figures:
        script = (f"<script>{get_plotlyjs()}</script>" if self_contained
                  else f'<script src="{PLOTLY_JS}"></script>')
    body = "".join(_section(section) for section in page.sections)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{html.escape(page.title)}</title><style>{CSS}</style>{script}</head>\n"
            f"<body><main><h1>{html.escape(page.title)}</h1>\n<p class='context'>{html.escape(page.context)}</p>\n"
            f"{body}</main></body></html>\n")


def context(model: nn.Module, measured: str, prompts: Sequence[str] = ()) -> str:
    """The page's context line: the model (name, weights' sha256 prefix, dtype), the prompts (the first two, and
    how many more), what was measured, and resid's version."""
    ident = identity(model, reuse=True)  # provenance computed it for the analysis just run: no second hash
    shown = "; ".join(repr(p if len(p) <= 120 else p[:117] + "...") for p in prompts[:2])
    more = f" (+{len(prompts) - 2} more)" if len(prompts) > 2 else ""
    said = f" · prompt{'s' if len(prompts) > 1 else ''}: {shown}{more}" if prompts else ""
    return (f"model {ident.name} (weights sha256 {ident.weights[:12]}, {ident.dtype}){said} · measured: {measured}"
            f" · resid {resid.__version__}")


def _section(section: Section) -> str:
    parts = []
    for part in section.parts:
        if isinstance(part, str):
            parts.append(f"<p>{html.escape(part)}</p>")
        elif isinstance(part, Table):
            parts.append(_table(part))
        else:
            parts.append(_figure(part))
    return f"<section><h2>{html.escape(section.heading)}</h2>\n" + "\n".join(parts) + "</section>\n"


def _figure(fig: go.Figure) -> str:
    height = fig.layout.height or HEIGHT
    div = fig.to_html(full_html=False, include_plotlyjs=False, default_width="100%", default_height=f"{height}px",
                      config={"responsive": True})
    return f"<div class='figure'>{div}</div>"


def _table(table: Table) -> str:
    df = table.frame
    shown = df.head(table.rows)
    numeric = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]
    formats = {c: _format(df[c], c in table.signed) for c in numeric} | dict(table.formats)
    peaks = {c: float(shown[c].abs().max()) for c in table.signed if c in numeric}
    head = "".join(f"<th class='{'num' if c in numeric else 'text'}'>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for _, row in shown.iterrows():
        cells = []
        for c in df.columns:
            value = row[c]
            text = "" if _missing(value) else (formats[c].format(value) if c in formats else str(value))
            style = f" style='background:{_tint(float(value), peaks[c])}'" if c in peaks and not _missing(value) else ""
            cells.append(f"<td class='{'num' if c in numeric else 'text'}'{style}>{html.escape(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = ""
    if len(df) > len(shown):
        where = f"; every row is in {table.full}" if table.full else ""
        more = f"<p class='more'>{len(df) - len(shown)} more rows not shown{html.escape(where)}.</p>"
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"


def _format(column: pd.Series, signed: bool) -> str:
    """Whole numbers as integers (a float column of layers or heads, NaN where none, included); other numbers to 4
    significant digits, with their sign when the column is signed."""
    values = column.dropna()
    if pd.api.types.is_integer_dtype(column) or (len(values) and (values == values.round()).all()
                                                  and values.abs().max() < 1e15):
        return "{:+.0f}" if signed else "{:.0f}"
    return "{:+.4g}" if signed else "{:.4g}"


def _missing(value: object) -> bool:
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def _tint(value: float, peak: float) -> str:
    """A signed cell's background: blue when positive, red when negative, its opacity the value's share of the
    largest magnitude shown (0.55 at most, so the number stays readable)."""
    r, g, b = POSITIVE if value >= 0 else NEGATIVE
    share = abs(value) / peak if peak > 0 else 0.0
    return f"rgba({r}, {g}, {b}, {0.55 * min(share, 1.0):.3f})"
