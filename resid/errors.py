"""The one error type resid raises for bad input: a single paragraph that says what went wrong and what to do.

Messages name the parameters they concern through `param(name, value)`, never by spelling `name=value` by hand:
in Python that renders as `method='mean'`; the command line renders the same error with its own flags
(`--method mean`) by installing a renderer for the duration of a command (`param_style`). Advice that only a
Python caller can follow (a parameter with no flag) is wrapped in `python_only(...)` and dropped there. So a
message is written once, and rewording it cannot break its command-line form.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_UNSET = object()
# name, value (or _UNSET) -> the command line's spelling, or None for "use the Python spelling"
Renderer = Callable[[str, object], str | None]
_RENDERER: ContextVar[Renderer | None] = ContextVar("resid_param_renderer", default=None)


class ResidError(Exception):
    """Bad input to resid (unknown model, malformed weights, wrong shapes, out-of-range sites, ...).

    The message is one paragraph written for the user: what was wrong, and what to do instead.
    """


def param(name: str, value: object = _UNSET) -> str:
    """A parameter as a message names it: `name` or `name=value` (value as repr, a torch dtype as
    `torch.float32`), or the command line's spelling under `param_style`."""
    renderer = _RENDERER.get()
    if renderer is not None:
        shown = renderer(name, value)
        if shown is not None:
            return shown
    if value is _UNSET:
        return name
    return f"{name}={value}" if type(value).__module__ == "torch" else f"{name}={value!r}"


def python_only(text: str) -> str:
    """Advice that names a parameter the command line has no flag for: `text` in Python, "" under the CLI."""
    return "" if _RENDERER.get() is not None else text


def unset() -> object:
    """The marker a renderer receives for a parameter named without a value."""
    return _UNSET


@contextmanager
def param_style(renderer: Renderer) -> Iterator[None]:
    """Render `param(...)` with `renderer` inside the block (the command line's flags)."""
    token = _RENDERER.set(renderer)
    try:
        yield
    finally:
        _RENDERER.reset(token)
