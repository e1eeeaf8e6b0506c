"""Reading prompts for scripted sweeps: JSONL, one object per line with "prompt", "target" and an optional
"baseline". A malformed line is an error naming its line number; nothing is half-read."""

import json
from dataclasses import dataclass
from pathlib import Path

from resid.errors import ResidError


@dataclass(frozen=True)
class PromptSet:
    prompts: list[str]
    targets: list[str | int]
    baselines: list[str | int] | None  # None when no line has a baseline


def read_jsonl(path: str | Path) -> PromptSet:
    path = Path(path)
    if not path.is_file():
        raise ResidError(f"Prompts file {path} does not exist; pass a JSONL file with prompt/target per line.")
    prompts, targets, baselines = [], [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ResidError(f"{path}, line {number}: not valid JSON ({err.msg}). Each line must be one object "
                             'like {"prompt": "...", "target": " Paris", "baseline": " London"}.') from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or "target" not in item:
            raise ResidError(f'{path}, line {number}: needs an object with a string "prompt" and a "target".')
        prompts.append(item["prompt"])
        targets.append(item["target"])
        baselines.append(item.get("baseline"))
    if not prompts:
        raise ResidError(f"{path} holds no prompts.")
    given = [b is not None for b in baselines]
    if any(given) and not all(given):
        first = given.index(False)
        raise ResidError(f"{path}: some lines have a baseline and some do not (e.g. prompt {first + 1}); "
                         "give every line a baseline, or none.")
    return PromptSet(prompts, targets, baselines if all(given) else None)
