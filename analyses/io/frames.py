"""The one CSV / Parquet codec of resid.analyses.io: how `tables` and `ResultStore` put a DataFrame in a file and
read it back exactly.

Glossary:
    text column   a column whose dtype is `str`, `string` or `object` (`is_text`): its cells are strings or
                  missing. In CSV it is always quoted and read with no NA parsing, so "", "nan", "NA", "None"
                  and "1" stay strings.
    schema        `[{"name", "dtype"[, "missing"]}]`, one entry per column in file order (`schema(df)`); what
                  CSV cannot say. `dtype` is the pandas dtype's name ("int64", "str", "string[pyarrow]",
                  "Int64", ...), or None: "as pandas infers it" (numbers: int64 / float64, bool). `missing`,
                  text columns only: the rows whose cell was missing, by kind, `{"None"|"NaN"|"NA": [rows]}`,
                  since a missing cell and "" are the same empty field in the file.
    categorical   a `category` column with string categories (e.g. neurons.value_top_tokens' "direction", kept
                  categorical there for memory: 1.8M rows). The file holds its values as text (readable in any
                  CSV tool); the schema adds "categories" (in order), their "categories_dtype" and "ordered",
                  and "missing" as for text, so `read` restores the same dtype, codes and all.

CSV floats: float32 / float16 are widened to float64 (exact) and written as the shortest repr that parses
back to the same double; pandas < 3.1 needs `float_precision="round_trip"` for that parse (its default parser
is one ulp off for about 40% of doubles, pandas 3.0 included), pandas 3.1 parses exactly by default and deprecates
the option. nan, inf, -0.0 and subnormals survive. Parquet stores dtypes itself; the schema then only restores
what pyarrow merges (None vs NaN in an object column, the storage of a `string` column). The index is never
stored.
"""

import csv
import math
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from resid.analyses.io import atomic
from resid.errors import ResidError

SUFFIXES = (".csv", ".parquet")  # the same formats as suffixes.STORE
_PANDAS_VERSION = tuple(int(part) for part in re.findall(r"\d+", pd.__version__)[:2])
_PANDAS_3 = _PANDAS_VERSION >= (3, 0)
_CSV_READ_OPTIONS = {} if _PANDAS_VERSION >= (3, 1) else {"float_precision": "round_trip"}
# The dtype of a column known only to be text (ResultStore): pandas 3's "str" keeps NaN as missing, while
# pandas 2's astype(str) would turn NaN into the string "nan", so there text stays object.
TEXT_DTYPE = "str" if _PANDAS_3 else "object"
_MISSING = {"None": None, "NaN": np.nan, "NA": pd.NA}


def is_text(dtype: object) -> bool:
    """Whether a column of this dtype is a text column (see the glossary)."""
    return isinstance(dtype, pd.StringDtype) or pd.api.types.is_object_dtype(dtype)


def _is_categorical(dtype: object) -> bool:
    return isinstance(dtype, pd.CategoricalDtype)


def _categorical(column: dict) -> pd.CategoricalDtype:
    """The categorical dtype a schema entry records."""
    categories = pd.Index(column["categories"], dtype=column["categories_dtype"])
    return pd.CategoricalDtype(categories, ordered=column["ordered"])


def _dtype_name(dtype: object) -> str:
    # str() of both "string" storages is "string"; name the storage so read() restores the same dtype
    if isinstance(dtype, pd.StringDtype) and dtype.na_value is pd.NA:
        return f"string[{dtype.storage}]"
    return str(dtype)


def schema(df: pd.DataFrame) -> list[dict]:
    """The schema of `df` (see the glossary); names as they are, for the caller to make JSON-safe."""
    columns = []
    for i, name in enumerate(df.columns):
        series = df.iloc[:, i]
        column = {"name": name, "dtype": _dtype_name(series.dtype)}
        if _is_categorical(series.dtype):
            categories = series.cat.categories
            column.update(categories=categories.tolist(), categories_dtype=_dtype_name(categories.dtype),
                          ordered=bool(series.cat.ordered))
        missing: dict[str, list[int]] = {}
        kept = is_text(series.dtype) or _is_categorical(series.dtype)
        for row in np.flatnonzero(series.isna().to_numpy()) if kept else []:
            value = series.iat[row]
            missing.setdefault("None" if value is None else "NA" if value is pd.NA else "NaN", []).append(int(row))
        columns.append({**column, "missing": missing} if missing else column)
    return columns


def check(df: pd.DataFrame, path: Path) -> None:
    """Raise unless `read(write(df))` gives `df` back exactly: unique string names; numeric, text or
    categorical (of string categories) columns."""
    names = list(df.columns)
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ResidError(f"Cannot write {path.name}: CSV and Parquet need unique string column names, got "
                         f"{names!r}. Rename the columns (df.columns = [...]) and export again.")
    for name in names:
        dtype = df[name].dtype
        if _is_categorical(dtype):
            if not all(isinstance(c, str) for c in dtype.categories):
                raise ResidError(f"Cannot write {path.name} exactly: categorical column {name!r} has categories "
                                 f"that are not strings ({list(dtype.categories[:5])!r}...). Convert it "
                                 "(.astype(str), or .astype(the categories' dtype)) or drop it.")
            continue
        numeric = pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_complex_dtype(dtype)
        strings = not pd.api.types.is_object_dtype(dtype) or all(isinstance(v, str) for v in df[name].dropna())
        if not (numeric or is_text(dtype)) or not strings:
            raise ResidError(f"Cannot write {path.name} exactly: column {name!r} has dtype {dtype} (or is an object "
                             "column holding non-strings). Convert it (.astype(str), .astype('float64')) or drop it.")


def write(df: pd.DataFrame, path: str | os.PathLike, *, sha256: bool = False) -> str | None:
    """Write `df` (not its index) to `path`, CSV or Parquet by its suffix, atomically (`resid.analyses.io.atomic`);
    with `sha256=True`, return the sha256 of the file. Call `check` first where exactness is promised."""
    path = Path(path)
    out = df.copy(deep=False)
    out.attrs = {}  # to_parquet would json.dumps attrs and fail on numpy values; provenance lives elsewhere
    if _suffix(path) == ".parquet":
        return atomic.write(path, lambda tmp: out.to_parquet(tmp, index=False), sha256=sha256)
    for name in out.columns:
        dtype = out[name].dtype
        if isinstance(dtype, np.dtype) and dtype.kind == "f":
            out[name] = out[name].astype("float64")  # exact widening; the float64 repr then round-trips
    # QUOTE_NONNUMERIC quotes every text field, so a lone "\r" or "" cannot be taken for a line end, and a
    # one-column row of "" is not a blank line.
    options = {"index": False, "quoting": csv.QUOTE_NONNUMERIC, "lineterminator": "\n", "encoding": "utf-8"}
    return atomic.write(path, lambda tmp: out.to_csv(tmp, **options), sha256=sha256)


def read(path: str | os.PathLike, columns: list[dict], only: list[str] | None = None) -> pd.DataFrame:
    """The frame `write` put at `path`, given its schema `columns`; `only` reads those columns (in file order).

    Raises when the file's columns are not the schema's."""
    path = Path(path)
    names = [c["name"] for c in columns]
    wanted = [c for c in columns if only is None or c["name"] in only]
    subset = None if only is None else [c["name"] for c in wanted]  # in file order, as read_csv returns them
    if _suffix(path) == ".parquet":  # pyarrow returns the columns in the order asked for
        df = parquet(path, subset)
    else:
        dtypes, na = {}, {}
        for c in wanted:
            dtype = c.get("dtype")
            if dtype == "category":  # its values as text; _restore turns them into the recorded categories
                dtypes[c["name"]] = TEXT_DTYPE
                continue
            if dtype is not None:  # CSV holds float64 reprs; _restore narrows float32 / float16 exactly
                dtypes[c["name"]] = "float64" if dtype.startswith("float") else dtype
            if dtype is None or not is_text(pd.api.types.pandas_dtype(dtype)):
                na[c["name"]] = [""]  # only an empty field is missing: "NA" or "nan" in text are strings
        # header=0 with names: the schema's names win over however the header line parses
        try:
            df = pd.read_csv(path, header=0, names=names, usecols=subset, dtype=dtypes, keep_default_na=False,
                             na_values=na, skip_blank_lines=False, encoding="utf-8", **_CSV_READ_OPTIONS)
        except (ValueError, OSError) as error:  # pandas' ParserError and a cell of the wrong type are ValueErrors
            raise _damaged(path, "CSV", error) from None
    if list(df.columns) != (names if subset is None else subset):
        raise ResidError(f"{path.name} does not match the schema it was written with: it has columns "
                         f"{list(df.columns)}, the schema {names}. Write it again.")
    return _restore(df, wanted)


def parquet(path: str | os.PathLike, columns: list[str] | None = None) -> pd.DataFrame:
    """A Parquet file as pyarrow stores it (`columns` only, in that order); a truncated or damaged file is an
    error naming it."""
    try:
        return pd.read_parquet(path, columns=columns)
    except (ValueError, OSError) as error:  # pyarrow's ArrowInvalid is a ValueError, a torn footer an OSError
        raise _damaged(Path(path), "Parquet", error) from None


def _damaged(path: Path, kind: str, error: Exception) -> ResidError:
    return ResidError(f"{path} could not be read as {kind} ({str(error).splitlines()[0][:200]}): the file is "
                      "truncated or damaged. Delete it and run the command that wrote it again (or restore it from "
                      "a copy).")


def _suffix(path: Path) -> str:
    if path.suffix.lower() not in SUFFIXES:
        raise ResidError(f"Cannot read or write {path.name!r} as a table: the name must end in .csv or .parquet.")
    return path.suffix.lower()


def _restore(df: pd.DataFrame, columns: list[dict]) -> pd.DataFrame:
    restored = {}
    for i, column in enumerate(columns):
        series = df.iloc[:, i]
        if column.get("dtype") is not None:
            category = column["dtype"] == "category"
            dtype = _categorical(column) if category else pd.api.types.pandas_dtype(column["dtype"])
            series = series.astype(dtype)
            if column.get("missing"):
                values = series.to_numpy(dtype=object, copy=True)
                for kind, rows in column["missing"].items():
                    values[rows] = _MISSING[kind]
                series = pd.Series(values, dtype=dtype)
        restored[column["name"]] = series.reset_index(drop=True)
    return pd.DataFrame(restored, index=pd.RangeIndex(len(df)))


# Values as the result store reads them back from chunks that disagree on dtypes (resid.analyses.io.store).


def key_value(value: object) -> object:
    """One key value as plain Python, so a caller's (3, "attn", None) equals what CSV / Parquet gave back."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return None
    # An optional-int column read back as float64: 2.0 -> 2 (equal with the same hash anyway, but prints as given).
    return int(value) if isinstance(value, float) and value.is_integer() else value


def shows_text(column: pd.Series) -> bool:
    # By values, not dtype (is_text): chunks disagree on dtypes, and an all-None object column (head of
    # MLP rows) says nothing, while a column of strings is text whatever its dtype (object, str, category).
    values = column.dropna().tolist()
    return bool(values) and all(isinstance(value, str) for value in values)


def is_optional_int(column: pd.Series) -> bool:
    values = column.dropna().tolist()
    whole = (isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer() for v in values)
    return 0 < len(values) < len(column) and all(whole)
