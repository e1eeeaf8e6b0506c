"""Checks of command-line arguments that need no model, shared by the subcommands' `check(args)`.

Each one turns an argument string into the value `run` uses (or raises a one-line ResidError naming the
flag), so main can validate everything before `load` spends seconds reading weights.
"""

import os
from contextlib import contextmanager
from pathlib import Path

from resid.errors import ResidError


def at_least(value: int, minimum: int, flag: str) -> int:
    if value < minimum:
        raise ResidError(f"{flag} must be at least {minimum}, got {value}.")
    return value


def batch_size(text: str, flag: str = "--batch-size") -> int | str:
    """'auto' or a positive integer."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise ResidError(f"{flag} must be a positive integer or 'auto', got {text!r}.")
    return int(text)


def ints(text: str | None, flag: str) -> list[int] | None:
    """'5' or '5,-7' -> [5, -7]; None stays None (the flag's "all")."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(p.lstrip("-").isdigit() for p in parts):
        raise ResidError(f"{flag} must be integers separated by commas (e.g. '5' or '5,7'), got {text!r}.")
    return [int(p) for p in parts]


def layers(text: str, flag: str = "--layers") -> list[int] | None:
    """'all' -> None (every layer), else a list of layer indices."""
    return None if text.strip().lower() == "all" else ints(text, flag)


def positions(text: str, flag: str = "--positions") -> list[int] | str:
    """'all', or comma-separated prompt positions (negative from the end)."""
    if text == "all":
        return text
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise ResidError(f"{flag} must be 'all' or comma-separated integers like 0,-1; got {text!r}.") from None


def neuron_pairs(text: str, flag: str = "--neurons") -> list[tuple[int, int]]:
    """'20:5,21:7' -> [(20, 5), (21, 7)]."""
    pairs = []
    for part in text.split(","):
        layer, _, neuron = part.strip().partition(":")
        if not (layer.lstrip("-").isdigit() and neuron.isdigit()):
            raise ResidError(f"{flag} must be layer:neuron pairs such as '20:5,21:7', got {text!r}.")
        pairs.append((int(layer), int(neuron)))
    return pairs


def out_path(path: str | None, suffixes: tuple[str, ...], flag: str = "--out") -> str | None:
    """A file whose suffix picks its format, in a place that can be written: refused now rather than after the
    model has run."""
    if path is not None and Path(path).suffix.lower() not in suffixes:
        raise ResidError(f"{flag} {path!r} must end in one of {', '.join(suffixes)} (the suffix picks the format).")
    if path is not None:
        if Path(path).is_dir():
            raise ResidError(f"{flag} {path} is a folder; give a file name in it, e.g. {Path(path) / 'results'}"
                             f"{suffixes[0]}.")
        _writable(Path(path).parent, flag, path)
    return path


def not_being_written(path: str, flag: str = "--out") -> None:
    """Refuse at once an output that another process is writing (it holds `<out>.lock`)."""
    from resid.analyses.io.lock import holder

    found = holder(Path(f"{path}.lock"))
    if found is not None:
        raise ResidError(f"Another process ({found}) is writing results to {path}. Two writers of one {flag} would mix "
                         f"their rows: wait for it to finish (or stop it), or choose another {flag} path.")


@contextmanager
def one_writer(path: str | None, flag: str = "--out"):
    """Hold the result store's lock on `<out>.lock` (resid.analyses.io.lock) while a command computes and writes
    `path`, whatever it writes there (a table, a graph, a folder of files): a second command into the same output is
    refused rather than overwriting the first one's files with both exiting 0. A result store or checkpoint store of
    the same output opened inside takes the lock over (same process)."""
    if path is None:
        yield
        return
    from resid.analyses.io.lock import OutputLock

    out = Path(path)
    not_being_written(str(out), flag)  # the message names the flag; the lock below closes the race after it
    lock = OutputLock(Path(f"{out}.lock"), out)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def out_folder(path: str | None, flag: str = "--out") -> str | None:
    """A folder the command writes its files into (made if missing), checked to be writable before the model loads."""
    if path is not None:
        if Path(path).exists() and not Path(path).is_dir():
            raise ResidError(f"{flag} {path} is a file, but this command writes a folder of files there; give a "
                             "folder path.")
        _writable(Path(path), flag, path)
    return path


def _writable(folder: Path, flag: str, given: str) -> None:
    # The writers make missing folders, so the nearest existing one decides. os.access asks the kernel, so a
    # read-only file system counts as well as permissions (with the effective ids, as the writes will use).
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ResidError(f"{flag} {given} cannot be written: {existing} is a file, not a folder.")
    effective = os.access in os.supports_effective_ids
    if not os.access(existing, os.W_OK | os.X_OK, effective_ids=effective):
        place = "its folder" if existing == folder else f"the nearest existing folder above it, {existing},"
        raise ResidError(f"{flag} {given} cannot be written: {place} is not writable (permissions, or a read-only "
                         f"file system). Choose another {flag} path.")


def existing_file(path: str, flag: str) -> str:
    if not Path(path).is_file():
        raise ResidError(f"{flag} {path} does not exist or is not a file.")
    return path


def translators(lens: str | None, folder: str | None):
    """--lens and --translators: the tuned lens's translators read now (None for the logit lens), so that a wrong
    folder fails before the model loads; the lens itself is made with the model."""
    if folder is None:
        if lens == "tuned":
            raise ResidError("--lens tuned needs --translators DIR: a folder written by `resid lens train` (or "
                             "tuned-lens's config.json + params.pt).")
        return None
    if lens == "logit":
        raise ResidError("--translators is for the tuned lens: drop --lens logit (or --translators).")
    from resid.analyses.lenses import formats

    return formats.read_translators(folder)


def self_contained(parser) -> None:
    """--shared-js (and --self-contained, the default), for the subcommands that write HTML figures: each page
    embeds plotly.js (4.8 MB) and opens alone, wherever it is copied, unless --shared-js asks for one plotly.min.js
    beside the pages (smaller pages, for a folder of many, but they open only beside it)."""
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--shared-js", dest="self_contained", action="store_false",
                        help="pages load one plotly.min.js (4.8 MB) written beside them: smaller pages, which open "
                             "only beside it (default: every page embeds plotly.js and opens alone)")
    choice.add_argument("--self-contained", dest="self_contained", action="store_true",
                        help="every page embeds plotly.js (the default)")
    parser.set_defaults(self_contained=True)


def executor_options(parser) -> None:
    """--ray [ADDRESS] and --workers N, for the subcommands whose work runs in chunks (resid.analyses.distributed)."""
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="run the chunks on Ray workers, each loading the model once: a local cluster, or the "
                        "running cluster at ADDRESS ('auto', 'ray://host:10001'); needs pip install "
                        "'resid-stream[distributed]'")
    parser.add_argument("--workers", type=int, default=None,
                        help="Ray workers (default: one per GPU of the cluster, else one per CPU)")


def executor(ray: str | None, workers: int | None):
    """The executor of --ray / --workers (None: in process), made before the model loads, so that a missing Ray
    is reported at once. It connects to the cluster only when the command runs."""
    if ray is None:
        if workers is not None:
            raise ResidError("--workers goes with --ray [ADDRESS]: add --ray to run on Ray workers.")
        return None
    if workers is not None:
        at_least(workers, 1, "--workers")
    from resid.analyses.distributed.ray_executor import RayExecutor

    return RayExecutor(workers=workers, address=None if ray == "local" else ray)


def quiet(parser) -> None:
    """--quiet, for the subcommands that run a long job (its progress bar is drawn on a terminal by default)."""
    parser.add_argument("--quiet", action="store_true", help="no progress bar (default: a bar when stderr is a "
                        "terminal)")


def execution(batch_size: int | str, quiet: bool = False, executor=None, out: str | None = None):
    """The one Execution (resid.analyses.Execution) of a subcommand's flags, made in `run`, once `check` has turned
    --batch-size into 'auto' or an int and --ray / --workers into an executor: --quiet draws no bar (else one on
    a terminal), `out` is the result store where --out is one (resid ablate's; a table written afterwards, a
    folder or a graph file is not)."""
    from resid.analyses.distributed.execution import Execution

    return Execution(executor=executor, batch_size=batch_size, progress=False if quiet else None, out=out)


def scan_options(parser, what: str) -> None:
    """The corpus-scan flags of `neurons top` and `features top` (`what`: the token shown, e.g. "the trigger")."""
    parser.add_argument("--corpus", default=None, help=".txt (blank-line paragraphs) or .jsonl {'text': ...}; "
                        "default: the demo corpus (State of the Union addresses)")
    parser.add_argument("--max-docs", type=int, default=300, help="demo corpus: documents to use (default 300)")
    parser.add_argument("--context", type=int, default=12, help=f"tokens shown before {what} (default 12)")
    parser.add_argument("--sign", default="positive", choices=["positive", "negative", "abs"])
    parser.add_argument("--batch-size", default="auto", help="windows per forward pass, or auto")
    quiet(parser)
    executor_options(parser)


def scan(args) -> None:
    """Check the flags of scan_options; sets args.batch_size, args.texts (None: the demo, read in run) and
    args.executor."""
    from resid.analyses import corpus

    at_least(args.max_docs, 1, "--max-docs")
    at_least(args.context, 0, "--context")
    args.batch_size = batch_size(args.batch_size)
    args.texts = corpus.load(args.corpus) if args.corpus else None
    args.executor = executor(args.ray, args.workers)
