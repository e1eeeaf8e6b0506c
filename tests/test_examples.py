"""The example inputs under examples/ are what the README's commands say they are: resid's own readers read them,
every target and baseline is one token of the default model, each pair's prompts have the same length (exact
patching needs no alignment), and the README's commands name them."""

import re
from pathlib import Path

from resid.analyses.io import prompts_file, texts

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def test_prompts_read_and_their_targets_are_single_tokens(smollm2) -> None:
    found = prompts_file.read_jsonl(EXAMPLES / "prompts.jsonl")
    found.require_targets("resid ablate")
    assert len(found.prompts) >= 4 and found.baselines is not None
    for target, baseline in zip(found.targets, found.baselines, strict=True):
        assert smollm2.to_single_token(target) != smollm2.to_single_token(baseline)


def test_pairs_read_and_each_pair_has_one_length(smollm2) -> None:
    pairs = texts.records(EXAMPLES / "pairs.jsonl", {"clean": str, "corrupt": str, "target": str, "baseline": str},
                          "{}", "pairs")
    assert len(pairs) >= 3
    for _, pair in pairs:
        clean, corrupt = (smollm2.tokenizer.encode(pair[k]) for k in ("clean", "corrupt"))
        assert len(clean) == len(corrupt) and clean != corrupt
        smollm2.to_single_token(pair["target"]), smollm2.to_single_token(pair["baseline"])


def test_corpus_reads_as_paragraphs() -> None:
    paragraphs = texts.read(EXAMPLES / "corpus.txt", "corpus")
    assert len(paragraphs) >= 5 and all(len(p.split()) >= 10 for p in paragraphs)


def test_the_readme_commands_use_them() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"examples/[\w.]+", readme))
    assert {"examples/prompts.jsonl", "examples/pairs.jsonl", "examples/corpus.txt"} <= named
    assert all((ROOT / path).is_file() for path in named), named
