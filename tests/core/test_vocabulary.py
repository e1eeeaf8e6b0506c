"""The field vocabulary is one list (resid.sites.vocabulary): every field it names is a field of the records, what
a Capture may keep, what a Site may address and what TransformerLens's names read, and no other module of the core
restates it."""

import ast
from pathlib import Path

import pytest

import resid
from resid.capture import Capture
from resid.errors import ResidError
from resid.records import AttnRecord, MLPRecord
from resid.sites import Site, transformerlens, vocabulary

ROOT = Path(resid.__file__).parent


@pytest.mark.parametrize("part, record", [("attn", AttnRecord), ("mlp", MLPRecord)])
def test_every_field_is_a_record_field_a_capture_field_and_a_site(part, record):
    fields = vocabulary.of_part(part)
    assert all(isinstance(getattr(record, name, None), property) for name in fields), fields
    assert Capture.all().fields(part) == frozenset(fields)
    for name in fields:
        assert Site(0, part, field=name).what == name
    with pytest.raises(ResidError, match="unknown field"):
        Capture(**{part: {"not_a_field"}})


def test_transformerlens_names_read_fields_of_the_vocabulary():
    for row in transformerlens.TABLE:
        if row.field is not None:
            assert row.field in vocabulary.of_part(row.part), row
        if row.unit is not None:  # the index a hook's tensor is selected by is the one a Site selects it by
            assert row.field in vocabulary.UNIT_FIELDS[row.unit], row


def _string_collections(path: Path):
    """Every tuple / list / set literal of strings in a module, as a set of its strings."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if strings:
                yield node.lineno, strings


def test_no_other_module_of_the_core_restates_the_field_lists():
    # A list holding most of a sublayer's fields is a restatement: the vocabulary is read, never retyped. (A
    # subset for another concept, such as interventions' editable fields, names fewer.)
    restated = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "vocabulary.py":
            continue
        for line, strings in _string_collections(path):
            for fields in (vocabulary.ATTN_FIELDS, vocabulary.MLP_FIELDS):
                specific = set(fields) - {"out", "normalized", "norm_scale", "post_norm_scale", "resid_norm_scale"}
                if specific <= strings:
                    restated.append(f"{path.relative_to(ROOT)}:{line}")
    assert not restated, f"field lists restated outside resid/sites/vocabulary.py: {restated}"
