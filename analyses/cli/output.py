"""What the subcommands print, shared: probabilities in one format, and the notes an analysis attaches to the
frame it returns (`df.attrs["notes"]`, a list of strings, e.g. a hint about a target's leading space)."""

from collections.abc import Iterable


def prob(p: float, width: int = 9) -> str:
    """Three significant digits for every probability, so 4.1e-05 never prints as 0.0000 beside 3.3e-05."""
    return f"{p:{width}.3g}"


def notes(*frames) -> list[str]:
    """One "note: ..." line per note of the frames, each note once (decompose's two frames may share one)."""
    found: Iterable[str] = (note for df in frames for note in df.attrs.get("notes", ()))
    return [f"note: {note}" for note in dict.fromkeys(found)]
