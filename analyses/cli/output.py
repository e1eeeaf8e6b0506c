"""What the subcommands print, shared: probabilities in one format, the notes an analysis attaches to the
frame it returns (`df.attrs["notes"]`, a list of strings, e.g. a hint about a target's leading space), and what
`--out DIR` gets beside a compact printout (the full table, a figure per unit: resid neurons, resid features)."""

from collections.abc import Iterable
from pathlib import Path

FIGURES = 10  # figures written into --out DIR at most
SHOWN = 40  # lines printed before "... more"


def prob(p: float, width: int = 9) -> str:
    """Three significant digits for every probability, so 4.1e-05 never prints as 0.0000 beside 3.3e-05."""
    return f"{p:{width}.3g}"


def notes(*frames) -> list[str]:
    """One "note: ..." line per note of the frames, each note once (decompose's two frames may share one)."""
    found: Iterable[str] = (note for df in frames for note in df.attrs.get("notes", ()))
    return [f"note: {note}" for note in dict.fromkeys(found)]


def more(total: int, shown: int = SHOWN) -> list[str]:
    return [f"... {total - shown} more (--out DIR writes the full table)"] if total > shown else []


def export_table(df, args, name: str) -> list[str]:
    """The full table into --out DIR, as `name`.--format with its provenance sidecar."""
    from resid.analyses import tables

    path = tables.export(df, Path(args.out) / f"{name}.{args.format}")
    return [f"table -> {path} (+ {path.name}.json)"]


def save_figure(fig, args, name: str) -> str:
    from resid.analyses import plots

    return f"figure -> {plots.save_html(fig, Path(args.out) / f'{name}.html', self_contained=args.self_contained)}"
