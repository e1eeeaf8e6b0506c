"""Errors raised by the analyses, reworded for the command line.

The analyses name their Python parameters (`reference=`, `method='mean'`, `baselines`); on the command line the
same advice must name the flag (`--reference`, `--method mean`, a "baseline" on every line of --prompts), and
advice with no flag behind it (`prepend_bos=True`) is dropped rather than pointing at something the user cannot
set. The table lives here, not in the analyses, so that their messages stay right for Python callers.
"""

import re

# (pattern, replacement), applied in order: whole phrases first, then single parameter spellings. The CLI's own
# messages pass through too, so no pattern may match a flag (hence `(?<!-)`) or CLI wording.
TRANSLATIONS: tuple[tuple[str, str], ...] = (
    # advice without a flag
    (r" \(or prepend_bos=True\)", ""),
    (r"; set prepend_bos=False", ""),
    # phrases
    (r"reference=\[\.\.\.\] \(one per prompt\)", "--reference FILE (one donor prompt per prompt, in order)"),
    (r"needs reference texts \(a list of strings or a text file\)", "needs --reference FILE (.txt or .jsonl texts)"),
    (r"\bneeds baselines \(one per prompt\)", 'needs a "baseline" on every line of --prompts'),
    (r"(?<!-)\breference (must|is used)\b", r"--reference \1"),
    (r"; use 'cpu'", "; use --device cpu"),
    (r"\bdtype=torch\.(\w+)", r"--dtype \1"),
    (r"\bcheck_unembedding=False", "--skip-unembedding-check"),
    # parameter='value' -> --flag value
    (r"\bmean_positions='(\w+)'", r"--mean-positions \1"),
    (r"(?<!-)\b(method|metric|level|norm|sites|sign|device)='([^']*)'", r"--\1 \2"),
    (r"(?<!-)\b(reference|target|baseline|positions)=", r"--\1 "),
)


def for_cli(message: str) -> str:
    """`message` with the Python spellings of TRANSLATIONS replaced by the command line's."""
    for pattern, replacement in TRANSLATIONS:
        message = re.sub(pattern, replacement, message)
    return message
