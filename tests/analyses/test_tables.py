"""resid.analyses.tables: exact CSV / Parquet round trips (token strings that are nasty in CSV, every float), the
provenance sidecar, LaTeX / Markdown escaping and number formatting, atomic writes, and bad-input errors."""

import dataclasses
import datetime
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from random_models import make_random_model

import resid
from resid.analyses import provenance, tables
from resid.errors import ResidError

NASTY = ["", " Paris", "\n", "a,b", '"', "nan", "NA", "None", "\\", "é", "\ufffd", "\r", "\r\n", "  ", "\x00",
         "NULL", "#N/A", "-nan", "1e5", "True", "'", "a\tb", "<|endoftext|>"]


def nasty_frame() -> pd.DataFrame:
    n = len(NASTY) + 2
    floats = [1e-300, np.nan, np.inf, -np.inf, -0.0, 5e-324, 0.1, 1 / 3, 1e300, -2.5, 2.0**-1074 * 3]
    return pd.DataFrame({
        "layer": np.arange(n, dtype="int64"),
        "value": (floats * 3)[:n],
        "value32": np.array(([3.4e38, 1e-45, np.nan, -0.0, 0.1, np.inf] * 5)[:n], dtype="float32"),
        "head": pd.array([None if i % 3 == 0 else i for i in range(n)], dtype="Int64"),
        "correct": [i % 2 == 0 for i in range(n)],
        "token": pd.Series([*NASTY, None, np.nan], dtype="str"),
        "token_obj": pd.Series([None, *NASTY, np.nan], dtype=object),
        "token_nullable": pd.Series([*NASTY, None, ""], dtype="string"),
    })


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_round_trip_is_exact(tmp_path, suffix):
    df = nasty_frame()
    path = tables.export(df, tmp_path / "deep" / "folder" / f"attr{suffix}", {"analysis": "test"})
    back = tables.read(path)
    pd.testing.assert_frame_equal(back, df)
    assert back.attrs["provenance"] == {"analysis": "test", "resid_version": resid.__version__}
    # "" and missing are different values, and None stays None next to NaN in an object column
    assert back["token"].iloc[0] == "" and pd.isna(back["token"].iloc[-1])
    assert back["token_obj"].iloc[0] is None and back["token_obj"].iloc[-1] is not None
    assert sorted(os.listdir(path.parent)) == [f"attr{suffix}", f"attr{suffix}.json"]


def test_csv_round_trip_of_many_random_floats_is_exact(tmp_path):
    # pandas' default CSV float parser up to 3.0.x reads ~40% of doubles one ulp off (the decompose notebook's
    # round-trip assertion failed under it); 3.1 parses exactly. Whichever pandas is installed, every value of
    # every magnitude must come back bit for bit.
    rng = np.random.default_rng(0)
    n = 20_000
    wide = rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, n)
    df = pd.DataFrame({"double": wide, "single": wide.astype(np.float32), "logit": rng.standard_normal(n) * 20})
    back = tables.read(tables.export(df, tmp_path / "floats.csv"))
    for name in df.columns:
        assert back[name].dtype == df[name].dtype
        differ = np.flatnonzero(back[name].to_numpy().view(np.uint64 if name != "single" else np.uint32)
                                != df[name].to_numpy().view(np.uint64 if name != "single" else np.uint32))
        assert differ.size == 0, f"{name}: {differ.size} values changed, e.g. {df[name].iloc[differ[0]]!r}"


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_round_trip_single_text_column_and_odd_names(tmp_path, suffix):
    # one text column: a row of "" or missing would be a blank line in a naive CSV
    for df in [pd.DataFrame({"token": pd.Series(["", None, "", None], dtype="str")}),
               pd.DataFrame({name: [1.5] for name in [" Paris", "a,b", "\n", "é", "", '"q"', "\ufeffbom"]}),
               pd.DataFrame({"x": pd.Series([], dtype="float32"), "s": pd.Series([], dtype="str")})]:
        path = tables.export(df, tmp_path / f"t{suffix}")
        pd.testing.assert_frame_equal(tables.read(path), df)


text = st.one_of(st.text(st.characters(exclude_categories=("Cs",)), max_size=6), st.sampled_from(NASTY))


@st.composite
def frames(draw) -> pd.DataFrame:
    n = draw(st.integers(0, 5))

    def column(elements):
        return draw(st.lists(elements, min_size=n, max_size=n))

    columns = {
        "s": pd.Series(column(st.one_of(st.none(), text)), dtype="str"),
        "o": pd.Series(column(st.one_of(st.none(), st.just(np.nan), text)), dtype=object),
        "f": pd.Series(column(st.floats()), dtype="float64"),
        "f32": pd.Series(column(st.floats(width=32)), dtype="float32"),
        "i": pd.Series(column(st.integers(-(2**63), 2**63 - 1)), dtype="int64"),
        "head": pd.Series(column(st.one_of(st.none(), st.integers(-5, 5))), dtype="Int64"),
        "b": pd.Series(column(st.booleans()), dtype="bool"),
    }
    chosen = draw(st.lists(st.sampled_from(sorted(columns)), min_size=1, max_size=4, unique=True))
    return pd.DataFrame({name: columns[name] for name in chosen})


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_categorical_round_trip_is_exact(tmp_path, suffix):
    # "" is a category and a cell is missing: the same empty CSV field, told apart by the schema; the
    # unused category "nan" and the order of the categories survive, and so do the codes.
    df = pd.DataFrame({
        "direction": pd.Categorical(["bottom", "top", None, ""], categories=["top", "bottom", "", "nan"]),
        "level": pd.Categorical(["hi", "lo", "hi", "hi"], categories=["lo", "hi"], ordered=True),
        "value": [0.5, -1.0, 2.0, np.nan],
    })
    back = tables.read(tables.export(df, tmp_path / f"c{suffix}"))
    pd.testing.assert_frame_equal(back, df)
    assert back["direction"].cat.codes.tolist() == [1, 0, -1, 2] and back["level"].cat.ordered
    assert (back["level"] > "lo").tolist() == [True, False, True, True]


def test_categorical_csv_holds_the_values_as_text(tmp_path):
    path = tables.export(pd.DataFrame({"direction": pd.Categorical(["top", "bottom"])}), tmp_path / "c.csv")
    assert path.read_text().splitlines() == ['"direction"', '"top"', '"bottom"']


@settings(max_examples=30, deadline=None)
@given(frames())
def test_round_trip_property(df):
    with tempfile.TemporaryDirectory() as folder:
        for suffix in (".csv", ".parquet"):
            pd.testing.assert_frame_equal(tables.read(tables.export(df, Path(folder) / f"t{suffix}")), df)


@dataclasses.dataclass
class Options:
    positions: tuple = (-1,)


def test_provenance_values_that_json_cannot_hold(tmp_path):
    record = {
        "np_int": np.int64(3), "np_float": np.float32(0.5), "np_bool": np.bool_(True), "array": np.arange(3),
        "tensor": torch.tensor([1.0, 2.0]), "tensor_scalar": torch.tensor(2.5), "dtype": torch.float16,
        "device": torch.device("cpu"), "path": Path("/x/y.gguf"), "tuple": (1, "a"), "set": {3, 1, 2},
        "nan": float("nan"), "inf": np.inf, "when": datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc),
        "nested": {1: (np.int8(4),)}, "options": Options(), "na": pd.NA, "other": object(),
    }
    path = tables.export(pd.DataFrame({"x": [1]}), tmp_path / "p.csv", record)
    sidecar = json.loads(Path(f"{path}.json").read_text())
    expected = {
        "np_int": 3, "np_float": 0.5, "np_bool": True, "array": [0, 1, 2], "tensor": [1.0, 2.0],
        "tensor_scalar": 2.5, "dtype": "torch.float16", "device": "cpu", "path": "/x/y.gguf", "tuple": [1, "a"],
        "set": [1, 2, 3], "nan": "nan", "inf": "inf", "when": "2024-01-02T00:00:00+00:00",
        "nested": {"1": [4]}, "options": {"positions": [-1]}, "na": None,
    }
    assert {k: sidecar[k] for k in expected} == expected
    assert isinstance(sidecar["other"], str)
    assert tables.read(path).attrs["provenance"] == {k: v for k, v in sidecar.items() if k != "table"}


def test_sidecar_with_real_provenance(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(os.urandom(4096))
    model = make_random_model("llama_gqa")
    model.weight_files = (weights,)
    df = nasty_frame()
    df.attrs["provenance"] = provenance.describe(model, "attribution.direct", {"level": "head"}, "The Eiffel")
    path = tables.export(df, tmp_path / "attr.csv")
    sidecar = json.loads((tmp_path / "attr.csv.json").read_text())
    sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()
    assert sidecar["weight_files"] == [{"path": str(weights), "sha256": sha256}]
    assert sidecar["analysis"] == "attribution.direct" and sidecar["prompts"] == ["The Eiffel"]
    assert sidecar["resid_version"] == resid.__version__
    table = sidecar["table"]
    assert table["path"] == "attr.csv" and table["format"] == "csv" and table["rows"] == len(df)
    assert table["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert [c["name"] for c in table["columns"]] == list(df.columns)
    dtypes = {c["name"]: c["dtype"] for c in table["columns"]}
    assert dtypes["head"] == "Int64" and dtypes["token"] == "str" and dtypes["value32"] == "float32"
    missing = {c["name"]: c.get("missing") for c in table["columns"]}
    n = len(NASTY)
    assert missing["token"] == {"NaN": [n, n + 1]} and missing["token_obj"] == {"None": [0], "NaN": [n + 1]}
    assert missing["token_nullable"] == {"NA": [n]} and missing["value"] is None


def test_unknown_provenance_is_said(tmp_path):
    path = tables.export(pd.DataFrame({"x": [1.0]}), tmp_path / "t.md")
    sidecar = json.loads(Path(f"{path}.json").read_text())
    assert sidecar["provenance"].startswith("unknown") and sidecar["table"]["format"] == "md"
    assert sidecar["resid_version"] == resid.__version__


def test_every_sidecar_names_the_resid_version(tmp_path):
    # issue 27: a caller's own provenance said nothing of the resid that wrote the table
    path = tables.export(pd.DataFrame({"x": [1.0]}), tmp_path / "t.csv", {"experiment": "ioi-7"})
    sidecar = json.loads(Path(f"{path}.json").read_text())
    assert sidecar["experiment"] == "ioi-7" and sidecar["resid_version"] == resid.__version__
    # ... and one that says it is kept as given
    path = tables.export(pd.DataFrame({"x": [1.0]}), tmp_path / "u.csv", {"resid_version": "0.0.9"})
    assert json.loads(Path(f"{path}.json").read_text())["resid_version"] == "0.0.9"


def tex_cell(value: object) -> str:
    lines = tables.to_tex(pd.DataFrame({"token": [value]})).splitlines()
    return lines[lines.index("\\midrule") + 1].removesuffix(r" \\")


@pytest.mark.parametrize("text, expected", [
    ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"), ("_", r"\_"), ("{", r"\{"), ("}", r"\}"),
    ("~", r"\textasciitilde{}"), ("^", r"\textasciicircum{}"), ("\\", r"\textbackslash{}"),
    ("\n", r"\textbackslash{}n"), ("\t", r"\textbackslash{}t"), ("\r", r"\textbackslash{}r"),
    ("\x00", r"\textbackslash{}x00"), (" Paris", r"\textvisiblespace{}Paris"), ("x ", r"x\textvisiblespace{}"),
    ("a  b", r"a\textvisiblespace{}\textvisiblespace{}b"), ("a b", "a b"), ("--", "-{}-"), ("``", "`{}`"),
    ("<|endoftext|>", r"\textless{}\textbar{}endoftext\textbar{}\textgreater{}"), ("é\ufffd", "é\ufffd"),
    ("", ""), (None, "--"), ("50% of $x_1$", r"50\% of \$x\_1\$"),
])
def test_tex_escapes_every_special_character(text, expected):
    assert tex_cell(text) == expected


def test_tex_is_a_booktabs_body_with_consistent_digits():
    df = pd.DataFrame({
        "p_value %": [0.1, 12.345678, -0.0001235, 123456.0, 1e-7, 0.0, np.nan],
        "head": pd.array([1, 2, None, 4, 5, 6, 7], dtype="Int64"),
        "token": [" Paris", "a", "b", "c", "d", "e", "f"],
    })
    tex = tables.to_tex(df)
    lines = tex.splitlines()
    assert "documentclass" not in tex and lines[0] == r"\begin{tabular}{rrl}"
    assert lines[1:4] == [r"\toprule", r"p\_value \% & head & token \\", r"\midrule"]
    assert lines[-2:] == [r"\bottomrule", r"\end{tabular}"]
    cells = [line.removesuffix(r" \\").split(" & ") for line in lines[4:-2]]
    assert [c[0] for c in cells] == ["0.1000", "12.35", "$-$0.0001235", r"1.235$\times10^{5}$",
                                     r"1.000$\times10^{-7}$", "0.000", "--"]
    assert [c[1] for c in cells] == ["1", "2", "--", "4", "5", "6", "7"]
    md = tables.to_markdown(df, digits=2).splitlines()
    assert md[0] == r"| p\_value % | head | token |" and md[1] == "| ---: | ---: | :--- |"
    assert [row.split(" | ")[0].removeprefix("| ") for row in md[2:]] == [
        "0.10", "12", "-0.00012", "1.2e+05", "1.0e-07", "0.0", "--"]


def test_tex_caption_label_and_max_rows(tmp_path):
    df = pd.DataFrame({"x": np.arange(10)})
    tex = tables.to_tex(df, max_rows=3, caption="Top heads", label="tab:heads")
    lines = tex.splitlines()
    assert lines[:5] == [r"\begin{table}[t]", r"\centering", r"\caption{Top heads}", r"\label{tab:heads}",
                         "% first 3 of 10 rows"]
    assert lines[-1] == r"\end{table}" and sum(line.endswith(r" \\") for line in lines) == 4
    path = tables.export(df, tmp_path / "t.tex", digits=3, max_rows=3, caption="Top heads", label="tab:heads")
    assert path.read_text() == tex and json.loads(Path(f"{path}.json").read_text())["table"]["rows"] == 3


@pytest.mark.parametrize("text, expected", [
    ("a|b", r"a\|b"), ("\n", r"\n"), (" Paris", "␣Paris"), ("*x*", r"\*x\*"), ("\\", "\\\\"), ("a b", "a b"),
    ("_x_", r"\_x\_"), ("`c`", r"\`c\`"), ("<b>", r"\<b\>"), ("&amp;", r"\&amp;"), (None, "--"), ("é", "é"),
])
def test_markdown_escapes(text, expected):
    lines = tables.to_markdown(pd.DataFrame({"token": [text], "n": [3]})).splitlines()
    assert lines[:2] == ["| token | n |", "| :--- | ---: |"] and lines[2] == f"| {expected} | 3 |"


def test_unknown_suffix_names_the_supported_ones(tmp_path):
    with pytest.raises(ResidError, match=r"\.csv, \.parquet, \.tex, \.md"):
        tables.export(pd.DataFrame({"x": [1]}), tmp_path / "t.xlsx")
    assert not list(tmp_path.iterdir())


def test_failed_write_leaves_the_old_table_and_no_temp_file(tmp_path, monkeypatch):
    old = pd.DataFrame({"x": [1.0, 2.0]})
    path = tables.export(old, tmp_path / "t.csv")

    def crash(self, target, **kwargs):
        Path(target).write_text("x\n3.0\n")  # half a table, then the process "dies"
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", crash)
    with pytest.raises(OSError, match="disk full"):
        tables.export(pd.DataFrame({"x": [3.0, 4.0]}), path)
    monkeypatch.undo()
    pd.testing.assert_frame_equal(tables.read(path), old)
    assert sorted(os.listdir(tmp_path)) == ["t.csv", "t.csv.json"]


def test_read_refuses_what_it_cannot_restore(tmp_path):
    df = pd.DataFrame({"token": ["", None]})
    csv_path = tables.export(df, tmp_path / "t.csv")
    with csv_path.open("a") as handle:
        handle.write('"edited"\n')
    with pytest.raises(ResidError, match="does not match its sidecar"):
        tables.read(csv_path)
    Path(f"{csv_path}.json").unlink()
    with pytest.raises(ResidError, match="no sidecar"):
        tables.read(csv_path)
    parquet_path = tables.export(df, tmp_path / "t.parquet")
    Path(f"{parquet_path}.json").unlink()
    back = tables.read(parquet_path)  # pyarrow keeps the dtypes; only provenance is lost
    pd.testing.assert_frame_equal(back, df)
    assert "provenance" not in back.attrs
    Path(f"{parquet_path}.json").write_text("[1, 2]")
    with pytest.raises(ResidError, match="not a table sidecar"):
        tables.read(parquet_path)
    with pytest.raises(ResidError, match="for display"):
        tables.read(tables.export(df, tmp_path / "t.md"))
    with pytest.raises(ResidError, match="No table"):
        tables.read(tmp_path / "missing.parquet")


@pytest.mark.parametrize("df, kwargs, message", [
    (pd.DataFrame({"x": [1]}).set_index("x"), {}, "reset_index"),
    (pd.DataFrame({"x": [1]}), {"max_rows": 3}, r"\.tex and \.md only"),
    (pd.DataFrame({"x": pd.Categorical([1, 2])}), {}, "categories that are not strings"),
    (pd.DataFrame({"x": pd.Series([1, "a"], dtype=object)}), {}, "non-strings"),
    (pd.DataFrame([[1, 2]], columns=["x", "x"]), {}, "unique string column names"),
    (pd.DataFrame({"x": [1]}), {"provenance": {"table": 1}}, "reserves"),
])
def test_export_refuses_what_it_would_lose(tmp_path, df, kwargs, message):
    with pytest.raises(ResidError, match=message):
        tables.export(df, tmp_path / "t.csv", **kwargs)
