"""Reading prompts for scripted sweeps: a JSONL file (read by `analyses.io.texts`, which states the line rules)
of objects with a string "prompt", a "target" and an optional "baseline" (a token string or id each). A
malformed line is an error naming its line number; nothing is half-read."""

from dataclasses import dataclass
from pathlib import Path

from analyses.io import texts
from resid.errors import ResidError

EXAMPLE = '{"prompt": "The Eiffel Tower is in", "target": " Paris", "baseline": " London"}'


@dataclass(frozen=True)
class PromptSet:
    prompts: list[str]
    targets: list[str | int]
    baselines: list[str | int] | None  # None when no line has a baseline


def read_jsonl(path: str | Path) -> PromptSet:
    records = [record for _, record in texts.records(path, {"prompt": str, "target": object}, EXAMPLE, "prompts")]
    if not records:
        raise ResidError(f"{path} holds no prompts: give one {EXAMPLE} object per line.")
    baselines = [record.get("baseline") for record in records]
    given = [b is not None for b in baselines]
    if any(given) and not all(given):
        first = given.index(False)
        raise ResidError(f"{path}: some lines have a baseline and some do not (e.g. prompt {first + 1}); "
                         "give every line a baseline, or none.")
    prompts, targets = [r["prompt"] for r in records], [r["target"] for r in records]
    return PromptSet(prompts, targets, baselines if all(given) else None)
