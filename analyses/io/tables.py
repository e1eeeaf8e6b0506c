r"""Tables for papers: export a DataFrame as .csv/.parquet/.tex/.md plus a provenance sidecar; read .csv/.parquet back.

sidecar: `path + ".json"` (`attr.csv.json`) = the provenance (the argument, else `df.attrs["provenance"]` from
`resid.analyses.provenance.describe`, else one saying it is unknown; made JSON-safe by `_jsonable`; `resid_version`
added when it lacks one) plus `"table"`:
file name, format, rows written, sha256 of the file, `columns`: the codec's schema (`resid.analyses.io.frames`).

Exactness: `read(export(df, p))` equals `df`, dtypes included; `resid.analyses.io.frames` says how CSV and Parquet
keep floats, text ("", "nan", "NA" stay strings), categoricals (their values as text, the categories in the
schema) and missing cells (the schema lists them, by kind). Files are written atomically (`resid.analyses.io.atomic`),
table first, sidecar second: a crash leaves no half table, and `read` raises on any mismatch (sha256, rows,
columns). The index is not stored (a named index or MultiIndex is refused:
`reset_index()`). Dtypes come from the schema, so a CSV without its sidecar raises (`pandas.read_csv` reads it
best-effort); a Parquet without one is read as pyarrow stores it (no provenance; object text columns come back
as `str`).

Display (.tex, .md): `max_rows` keeps the first N rows. Floats get `digits` significant digits, trailing zeros
kept (`#.{digits}g`: fixed when the exponent is in [-4, digits), else `1.235$\times10^{-5}$` / `1.235e-05`); ints
as ints; NaN/NA `--`; inf `$\infty$` / `inf`. Text stays visible: newline, tab, CR as `\n \t \r`, other control
characters `\xNN`; leading, trailing and repeated (not single inner) spaces as `\textvisiblespace{}` / `␣`. Tex
escapes `& % $ # _ { } ~ ^ \ < > |`, breaks ligatures (`--`, ``` `` ```, `''`, `,,`, ``!` ?` ``) with `{}`, and
is a booktabs `tabular` (`r` numeric, `l` other columns) to `\input`, in a `table` float given a caption or label
(LaTeX source, not escaped); md backslash-escapes `` \ ` * _ [ ] < > | ~ & $ ``.
"""

import dataclasses
import datetime
import hashlib
import json
import math
import numbers
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

import resid
from resid.analyses.io import atomic, frames, suffixes
from resid.errors import ResidError

SUFFIXES = suffixes.TABLE
_TEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}
_MD_SPECIAL = {c: "\\" + c for c in "\\`*_[]<>|~&$"}
_CONTROL_NAMES = {"\n": "n", "\t": "t", "\r": "r"}
# T1/OT1 fonts turn these pairs into dashes, quotes and inverted marks; "{}" between them keeps two characters.
_TEX_LIGATURES = re.compile(r"(?<=-)(?=-)|(?<=`)(?=`)|(?<=')(?=')|(?<=,)(?=,)|(?<=[!?])(?=`)")


def _jsonable(value: object) -> object:
    """Nearest JSON value: numpy/torch values as numbers/lists, nan/inf as "nan"/"inf", else str()."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(float(value))
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        return items if isinstance(value, (list, tuple)) else sorted(items, key=repr)  # sets: same file every run
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if hasattr(value, "tolist"):  # numpy scalars and arrays, torch tensors
        return _jsonable(value.tolist())
    return str(value)  # paths, torch.dtype, torch.device, enums, ...: their readable name


def _escape(text: str, special: Mapping[str, str], backslash: str, space: str) -> str:
    parts = []
    for match in re.finditer(r"( +)|(.)", text, flags=re.DOTALL):
        if run := match.group(1):  # lone inner spaces are ordinary word breaks; others would be lost
            edge = match.start() == 0 or match.end() == len(text) or len(run) > 1
            parts.append(space * len(run) if edge else run)
        elif ord(char := match.group(2)) < 32 or ord(char) == 127:
            parts.append(backslash + _CONTROL_NAMES.get(char, f"x{ord(char):02x}"))
        else:
            parts.append(special.get(char, char))
    return "".join(parts)


def _text(text: str, tex: bool) -> str:
    if not tex:
        return _escape(text, _MD_SPECIAL, "\\", "␣")
    return _TEX_LIGATURES.sub("{}", _escape(text, _TEX_SPECIAL, r"\textbackslash{}", r"\textvisiblespace{}"))


def _cell(value: object, digits: int, tex: bool) -> str:
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return "--"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if not isinstance(value, numbers.Real):
        return _text(str(value), tex)
    value = float(value)
    if math.isinf(value):
        return ("$-\\infty$" if value < 0 else "$\\infty$") if tex else repr(value)
    mantissa, _, exponent = format(abs(value), f"#.{digits}g").partition("e")
    mantissa = mantissa.rstrip(".")  # "#g" keeps the point of "1000."
    negative = math.copysign(1.0, value) < 0  # -0.0 too
    sign, times = ("$-$", f"$\\times10^{{{int(exponent or 0)}}}$") if tex else ("-", f"e{exponent}")
    return (sign if negative else "") + mantissa + (times if exponent else "")


def _shown(df: pd.DataFrame, digits: int, max_rows: int | None, tex: bool) -> tuple[list, list, list[list[str]]]:
    """(is each column numeric, headers, rows of cells)."""
    if digits < 1 or (max_rows is not None and max_rows < 0):
        raise ResidError(f"digits must be >= 1 and max_rows >= 0 or None, got digits={digits}, max_rows={max_rows}.")
    shown = df.iloc[:max_rows]
    columns = [[_cell(v, digits, tex) for v in shown.iloc[:, i].tolist()] for i in range(shown.shape[1])]
    numeric = [pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t) for t in df.dtypes]
    return numeric, [_text(str(n), tex) for n in df.columns], [[c[r] for c in columns] for r in range(len(shown))]


def to_tex(df: pd.DataFrame, *, digits: int = 4, max_rows: int | None = None, caption: str | None = None,
           label: str | None = None) -> str:
    """A booktabs tabular (in a table float when caption or label is given), ready to \\input."""
    numeric, headers, rows = _shown(df, digits, max_rows, tex=True)
    spec = "".join("r" if n else "l" for n in numeric)
    lines = [f"% first {len(rows)} of {len(df)} rows"] if len(rows) < len(df) else []
    lines += [f"\\begin{{tabular}}{{{spec}}}", "\\toprule", " & ".join(headers) + r" \\", "\\midrule"]
    lines += [" & ".join(row) + r" \\" for row in rows] + ["\\bottomrule", "\\end{tabular}"]
    if caption is not None or label is not None:
        head = ["\\begin{table}[t]", "\\centering"] + ([f"\\caption{{{caption}}}"] if caption is not None else [])
        lines = head + ([f"\\label{{{label}}}"] if label is not None else []) + lines + ["\\end{table}"]
    return "\n".join(lines) + "\n"


def to_markdown(df: pd.DataFrame, *, digits: int = 4, max_rows: int | None = None) -> str:
    """A GitHub pipe table."""
    numeric, headers, rows = _shown(df, digits, max_rows, tex=False)
    align = ["---:" if n else ":---" for n in numeric]
    lines = ["| " + " | ".join(cells) + " |" for cells in [headers, align, *rows]]
    lines += [f"\n<!-- first {len(rows)} of {len(df)} rows -->"] if len(rows) < len(df) else []
    return "\n".join(lines) + "\n"


def export(df: pd.DataFrame, path: str | Path, provenance: dict | None = None, *, digits: int = 4,
           max_rows: int | None = None, caption: str | None = None, label: str | None = None) -> Path:
    """Write `df` to `path` (format from the suffix) and its provenance sidecar `path + ".json"`."""
    path = Path(path)
    kind = path.suffix.lower()
    if kind not in SUFFIXES:
        raise ResidError(f"Cannot export to {path.name!r}: unknown suffix {path.suffix!r}. "
                         f"Use one of {', '.join(SUFFIXES)}.")
    if isinstance(df.columns, pd.MultiIndex) or list(df.index.names) != [None]:  # MultiIndex has several names
        raise ResidError(f"Cannot export to {path.name}: the table would drop the frame's named index or "
                         "MultiIndex. Call df.reset_index() (and flatten MultiIndex columns) first.")
    if kind in (".csv", ".parquet") and (max_rows is not None or caption is not None or label is not None):
        raise ResidError(f"max_rows, caption and label apply to .tex and .md only, not {path.name}; "
                         "slice the frame (df.head(n)) before exporting a data file.")
    record = provenance if provenance is not None else df.attrs.get("provenance")
    if record is None:
        record = {"provenance": "unknown: no provenance argument and no df.attrs['provenance']",
                  "resid_version": resid.__version__,
                  "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    record = _jsonable(record if isinstance(record, Mapping) else {"provenance": record})
    record.setdefault("resid_version", resid.__version__)  # a caller's own provenance says which resid wrote it too
    if "table" in record:
        raise ResidError("The provenance has a 'table' key, which the sidecar reserves for the table schema; "
                         "rename that key and export again.")
    if kind in frames.SUFFIXES:
        frames.check(df, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind in frames.SUFFIXES:
        sha256 = frames.write(df, path, sha256=True)
    else:
        text = (to_tex(df, digits=digits, max_rows=max_rows, caption=caption, label=label) if kind == ".tex"
                else to_markdown(df, digits=digits, max_rows=max_rows))
        sha256 = atomic.write(path, text, sha256=True)
    rows = len(df) if max_rows is None else min(len(df), max_rows)
    columns = [{**c, "name": _jsonable(c["name"])} for c in frames.schema(df)]
    table = {"path": path.name, "format": kind[1:], "rows": rows, "sha256": sha256, "columns": columns}
    atomic.write(Path(f"{path}.json"), json.dumps({**record, "table": table}, indent=1) + "\n")
    return path


def read(path: str | Path) -> pd.DataFrame:
    """Read a table written by `export` (.csv or .parquet) back exactly, provenance in `attrs["provenance"]`."""
    path = Path(path)
    kind = path.suffix.lower()
    if kind not in (".csv", ".parquet"):
        raise ResidError(f"read() reads .csv and .parquet tables, not {path.name!r}: .tex and .md are for display. "
                         "Export a .csv or .parquet beside them to keep the data.")
    if not path.exists():
        raise ResidError(f"No table at {path}. Check the path, or export the table first.")
    sidecar = Path(f"{path}.json")
    if not sidecar.exists() and kind == ".csv":
        raise ResidError(f"{path.name} has no sidecar {sidecar.name}, so its dtypes and which strings were missing "
                         "cannot be restored exactly. Put the sidecar back beside it, or use pandas.read_csv.")
    if not sidecar.exists():
        return frames.parquet(path)
    try:
        record = json.loads(sidecar.read_text(encoding="utf-8"))
        table = record.pop("table")
        columns, rows, sha256 = table["columns"], table["rows"], table["sha256"]
        names = [c["name"] for c in columns]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ResidError(f"{sidecar.name} is not a table sidecar ({error!r}). Re-export the table, or delete "
                         "the sidecar to read a Parquet file without provenance.") from error
    if hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        raise ResidError(f"{path.name} does not match its sidecar {sidecar.name}: the table was changed or replaced "
                         "after export, or the export was interrupted. Re-export it, or read it with pandas.")
    if kind == ".csv" and not columns:  # a CSV of no columns has no header to parse
        df = pd.DataFrame(index=pd.RangeIndex(rows))
    else:
        df = frames.read(path, columns)
    if list(df.columns) != names or len(df) != rows:
        raise ResidError(f"{path.name} does not match its sidecar (columns or row count differ). Re-export it.")
    df.attrs["provenance"] = record
    return df
