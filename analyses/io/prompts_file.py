"""Reading prompts for scripted sweeps: a JSONL file (read by `resid.analyses.io.texts`, which states the line rules)
of objects with a string "prompt", an optional "target" and an optional "baseline" (a token string or id
each, checked as such when the file is read). A line without a target means that prompt's top prediction where
an analysis allows it (attribution); analyses that need targets (ablation) call `require_targets`. A malformed
line is an error naming its line number; nothing is half-read."""

from dataclasses import dataclass
from pathlib import Path

from resid.analyses.io import texts
from resid.errors import ResidError

EXAMPLE = '{"prompt": "The Eiffel Tower is in", "target": " Paris", "baseline": " London"}'


@dataclass(frozen=True)
class PromptSet:
    prompts: list[str]
    targets: list[str | int | None]  # None: no "target" on that line
    baselines: list[str | int] | None  # None when no line has a baseline
    path: Path
    lines: list[int]  # the file line of each prompt, for errors

    def require_targets(self, needed_by: str) -> None:
        """Raise, naming the first line without a "target", unless every prompt has one."""
        if None in self.targets:
            line = self.lines[self.targets.index(None)]
            raise ResidError(f'{self.path}, line {line} has no "target": {needed_by} needs a target on every line, '
                             f"like {EXAMPLE}.")


def check_tokens(path: str | Path, found: list[tuple[int, dict]], names: tuple[str, ...] = ("target", "baseline"),
                 example: str = EXAMPLE, required: tuple[str, ...] = ()) -> None:
    """Each of `names` given on a line (each of `required` always) must be a token (a string) or a token id (a
    whole number >= 0): checked with the file, before a model loads, rather than by the analysis after it."""
    for number, record in found:
        for name in names:
            value = record.get(name)
            if (value is None and name not in required) or isinstance(value, str) or (
                    isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                continue
            raise ResidError(f'{path}, line {number}: "{name}" must be a token (a string such as " Paris") or a '
                             f"token id (a whole number >= 0), got {value!r}. Each line is an object like {example}.")


def read_jsonl(path: str | Path) -> PromptSet:
    found = texts.records(path, {"prompt": str}, EXAMPLE, "prompts")
    if not found:
        raise ResidError(f"{path} holds no prompts: give one {EXAMPLE} object per line.")
    check_tokens(path, found)
    records = [record for _, record in found]
    baselines = [record.get("baseline") for record in records]
    given = [b is not None for b in baselines]
    if any(given) and not all(given):
        first = given.index(False)
        raise ResidError(f"{path}: some lines have a baseline and some do not (e.g. prompt {first + 1}); "
                         "give every line a baseline, or none.")
    prompts, targets = [r["prompt"] for r in records], [r.get("target") for r in records]
    return PromptSet(prompts, targets, baselines if all(given) else None, Path(path), [n for n, _ in found])
