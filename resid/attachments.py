"""What the core knows of things attached to one run: a protocol, so that the forward pass holds no dictionary code
and the core imports nothing above it (resid.dictionaries attaches learned dictionaries through it).

    model.run(inputs, dictionaries=[sae, Splice(transcoder)])

The kinds of value a package attaches are registered with the function that makes one `Attachment` of a run's
items (`register`; resid.dictionaries registers its Dictionary, CrossLayerTranscoder, Observe and Splice when it is
imported, which it is wherever one of them exists). For one run the core then asks that Attachment:

    capture(capture)              the Capture the run needs: the caller's plus what the attachment reads
    interventions(interventions)  the interventions to apply: the caller's (some made into the attachment's own,
                                  e.g. edits of a dictionary's features) plus its Hooks (the splices)
    finish(run)                   the Run after the pass, with what the attachment recorded (run.dictionaries)
"""

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from resid.capture import Capture
from resid.errors import ResidError
from resid.interventions import Intervention
from resid.run import Run


@runtime_checkable
class Attachment(Protocol):
    """The items attached to one run, as the core calls them (see the module docstring)."""

    def capture(self, capture: Capture) -> Capture: ...

    def interventions(self, interventions: Sequence[Intervention]) -> list[Intervention]: ...

    def finish(self, run: Run) -> Run: ...


Make = Callable[[object, Sequence[object], bool], Attachment]  # (model, the run's items, grad) -> Attachment
_MAKERS: dict[type, Make] = {}


def register(kinds: Sequence[type], make: Make) -> None:
    """Attach values of these types with `make` (a package calls it once, when it is imported)."""
    for kind in kinds:
        _MAKERS[kind] = make


def attach(model, items: Sequence[object], grad: bool) -> Attachment:
    """The Attachment of a run's `dictionaries=` items: all of one package's kinds, made by its registered maker."""
    makers = {_maker(item) for item in items}
    if len(makers) > 1:
        raise ResidError("dictionaries= mixes values that attach in different ways: give one package's values per run.")
    return makers.pop()(model, list(items), grad)


def _maker(item: object) -> Make:
    for kind in type(item).__mro__:
        if kind in _MAKERS:
            return _MAKERS[kind]
    raise ResidError(f"dictionaries= takes resid.dictionaries.Dictionary or CrossLayerTranscoder values (or Observe / "
                     f"Splice of one), got {type(item).__name__}.")
