"""resid.analyses.io.texts: the one .txt rule and the one JSONL reader, and that the corpus, the mean-ablation
reference and prompt sets all read files through them."""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from resid.analyses.io import corpus, texts
from resid.analyses.io.prompts_file import read_jsonl
from resid.analyses.sweeps.values import read_reference
from resid.errors import ResidError

PARAGRAPHS = "  First paragraph,\nstill the first.  \n\n \t \n\nSecond one.\r\n\r\nThird\n  indented line\n"


def test_txt_paragraph_rule(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes(PARAGRAPHS.encode())
    # whitespace-only lines separate too; inner line breaks and inner indentation are kept; ends are stripped
    expected = ["First paragraph,\nstill the first.", "Second one.", "Third\n  indented line"]
    assert texts.read(path, "corpus") == expected == texts.paragraphs(PARAGRAPHS)


def test_txt_without_blank_line_is_one_text_per_line(tmp_path):
    path = tmp_path / "l.txt"
    path.write_text("  one per line\nanother line  \r\nthird\n\n")  # trailing newlines are not blank lines
    assert texts.read(path, "corpus") == ["one per line", "another line", "third"]
    # one blank line anywhere switches the whole file to paragraphs
    path.write_text("a\nb\n\nc\n")
    assert texts.read(path, "corpus") == ["a\nb", "c"]


def test_byte_order_mark_is_not_text(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffhello\nworld\n".encode())
    assert texts.read(path, "corpus") == ["hello", "world"]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(("\ufeff" + json.dumps({"text": "x"}) + "\n").encode())
    assert texts.read(path, "corpus") == ["x"]


# No line breaks or spaces (Cc, Zl, Zp, Zs), and no byte-order mark, which a file may only start with.
line = st.text(st.characters(exclude_categories=("Cs", "Cc", "Zl", "Zp", "Zs"), exclude_characters="\ufeff"),
               min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(st.lists(line, min_size=1, max_size=6), st.booleans())
def test_txt_rule_round_trips_lists_of_lines(items, paragraphs):
    # Texts without line breaks or edge spaces come back exactly, written either way the rule allows.
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.txt"
        path.write_text(("\n\n" if paragraphs else "\n").join(items) + "\n", encoding="utf-8")
        assert texts.read(path, "corpus") == items


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(st.characters(exclude_categories=("Cs",)), max_size=10), max_size=6))
@example(["a\u2028b", "c\x85d\u2029", "", "line\nbreak"])
def test_jsonl_round_trips_any_string(items):
    # One record per line even when a text holds U+2028 or U+0085, which JSON leaves unescaped and
    # str.splitlines would split at.
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        lines = [json.dumps({"text": t, "id": i}, ensure_ascii=False) for i, t in enumerate(items)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")
        assert texts.read(path, "corpus") == items


def test_jsonl_skips_blank_lines_and_counts_them(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"text": "a"}\r\n\n   \n{"text": "b", "other": 1}\n')
    assert texts.records(path, {"text": str}, "{}", "corpus") == [(1, {"text": "a"}), (4, {"text": "b", "other": 1})]
    assert texts.read(path, "corpus") == ["a", "b"]


@pytest.mark.parametrize("lines, message", [
    (['{"text": "a"}', "", "not json"], r"bad\.jsonl, line 3: not valid JSON \(Expecting value\)"),
    (['{"text": "a"', '{"text": "b"}'], r"bad\.jsonl, line 1: not valid JSON"),
    (['{"text": "a"}', '["text"]'], r"bad\.jsonl, line 2: not a JSON object"),
    (["", '{"body": "a"}'], r'bad\.jsonl, line 2 has no string field "text"'),
    (['{"text": 3}'], r'bad\.jsonl, line 1 has no string field "text": each line must be a JSON object like'),
])
def test_jsonl_errors_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ResidError, match=message) as error:
        texts.read(path, "corpus")
    assert str(path) in str(error.value) and "\n" not in str(error.value)  # one line for the CLI's error


def test_file_errors(tmp_path):
    with pytest.raises(ResidError, match=r"Cannot read a corpus from 'docs\.csv': unknown suffix '\.csv'"):
        texts.read(tmp_path / "docs.csv", "corpus")
    with pytest.raises(ResidError, match=r"unknown suffix '\(none\)'"):
        texts.read(tmp_path / "docs", "reference")
    with pytest.raises(ResidError, match=r"Reference file .*missing\.txt does not exist"):
        texts.read(tmp_path / "missing.txt", "reference")


@pytest.mark.parametrize("content", [PARAGRAPHS, "one\n two \nthree\n"])
def test_reference_follows_the_corpus_rule(tmp_path, content):
    path = tmp_path / "ref.txt"
    path.write_bytes(content.encode())
    assert read_reference(path) == read_reference(str(path)) == corpus.load(path) == texts.paragraphs(content)
    assert len(read_reference(path)) == 3  # three paragraphs; three lines


def test_reference_reads_jsonl_lists_and_refuses_the_rest(tmp_path):
    path = tmp_path / "ref.jsonl"
    path.write_text(json.dumps({"text": "first"}) + "\n" + json.dumps({"text": "  "}) + "\n")
    assert read_reference(path) == corpus.load(path) == ["first"]  # blank texts dropped by both
    assert read_reference(["a", " ", "b"]) == ["a", "b"]
    with pytest.raises(ResidError, match=r"reference 'no such file' is not a file; pass a list of texts"):
        read_reference("no such file")
    with pytest.raises(ResidError, match=r"is not a file"):
        read_reference(tmp_path / "missing.txt")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    with pytest.raises(ResidError, match="has no non-blank texts"):
        read_reference(blank)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "p", "target": " t"}) + "\n")
    with pytest.raises(ResidError, match=r'prompts\.jsonl, line 1 has no string field "text"'):
        read_reference(prompts)


def test_prompt_sets_use_the_same_line_reader(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": "a", "target": " x", "baseline": 7}, {"prompt": "b", "target": 3, "baseline": " y"}]
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    prompt_set = read_jsonl(path)
    assert (prompt_set.prompts, prompt_set.targets, prompt_set.baselines) == (["a", "b"], [" x", 3], [7, " y"])
    path.write_text(json.dumps({"prompt": "a", "target": " x"}) + "\n")
    assert read_jsonl(path).baselines is None
    path.write_text(json.dumps({"prompt": "a", "target": " x"}) + "\n\n" + json.dumps({"prompt": "c"}) + "\n")
    prompt_set = read_jsonl(path)  # no target: that prompt's top prediction, where the analysis allows it
    assert prompt_set.targets == [" x", None] and prompt_set.lines == [1, 3]
    with pytest.raises(ResidError, match=r'p\.jsonl, line 3 has no "target": resid ablate needs a target on every'):
        prompt_set.require_targets("resid ablate")
    path.write_text(json.dumps({"prompt": 1, "target": " x"}) + "\n")
    with pytest.raises(ResidError, match=r'line 1 has no string field "prompt"'):
        read_jsonl(path)
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"prompt": "c", "target": " z"}) + "\n")
    with pytest.raises(ResidError, match=r"some lines have a baseline and some do not \(e\.g\. prompt 2\)"):
        read_jsonl(path)
    path.write_text("\n\n")
    with pytest.raises(ResidError, match="holds no prompts"):
        read_jsonl(path)
    with pytest.raises(ResidError, match=r"Prompts file .*missing\.jsonl does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("encoding, named", [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16 or UTF-32"),
                                             ("utf-32", "UTF-32")])
def test_a_file_in_another_unicode_encoding_is_one_clear_error(tmp_path, encoding, named):
    # issue 27: a UTF-16 JSONL file gave a UnicodeDecodeError traceback
    path = tmp_path / "p.jsonl"
    path.write_bytes('{"prompt": "The Eiffel Tower is in", "target": " Paris"}\n'.encode(encoding))
    with pytest.raises(ResidError, match=f"is encoded as {named}.*; resid reads UTF-8. Save it as UTF-8"):
        read_jsonl(path)


def test_bytes_that_are_not_utf8_are_named_by_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("first line\nCaf\u00e9 au lait\n".encode("latin-1"))
    with pytest.raises(ResidError, match="is not UTF-8: line 2 holds the byte 0xe9"):
        texts.read(path, "corpus")


def test_a_lone_surrogate_escape_is_refused_with_the_file(tmp_path):
    # json.loads accepts "\ud83d" without its pair; no tokenizer can encode the result
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine", "target": " a"}\n{"prompt": "half an emoji \\ud83d", "target": " a"}\n')
    with pytest.raises(ResidError, match=r'p.jsonl, line 2: "prompt" .* holds a lone surrogate U\+D83D'):
        read_jsonl(path)
    path.write_text('{"prompt": "fine", "target": " a"}\n{"prompt": "a whole emoji \\ud83d\\ude00", "target": " a"}\n')
    assert read_jsonl(path).prompts[1] == "a whole emoji \U0001F600"


@pytest.mark.parametrize("target", [[" Paris"], 1.5, True, -3, {"token": " Paris"}])
def test_a_target_of_the_wrong_type_is_refused_with_the_file(tmp_path, target):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "a", "target": " b", "baseline": " c"}) + "\n"
                    + json.dumps({"prompt": "a", "target": " b", "baseline": target}) + "\n")
    with pytest.raises(ResidError, match=r'p.jsonl, line 2: "baseline" must be a token \(a string such as " Paris"\) '
                                         r"or a token id \(a whole number >= 0\)"):
        read_jsonl(path)
    path.write_text(json.dumps({"prompt": "a", "target": 7, "baseline": " c"}) + "\n")
    assert read_jsonl(path).targets == [7]
