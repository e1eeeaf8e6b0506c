"""Hostile input to the core, the result tables, graphs, feature scans and their commands (issue 38): each case
is one clear ResidError naming the file, field or option and what to do, never a traceback and never a
silently wrong result. Grouped by surface; each group is one parametrized test."""

import json
import math
import sys
from pathlib import Path

import encoder_models
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from random_dictionaries import random_dictionary
from random_models import make_random_model
from random_transcoders import cross_layer, per_layer

import resid
from resid.analyses import features, graphs, plots
from resid.analyses.cli.main import main
from resid.analyses.cli.output import notes
from resid.analyses.io import tables
from resid.analyses.io.store import ResultStore
from resid.dictionaries import Splice
from resid.errors import ResidError

# A tiny Llama's config.json, as transformers 5 writes it. The checks run before any weight file is opened, so
# the folders below hold config.json (and what a case adds) only.
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 48, "intermediate_size": 96,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 50257,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
GEMMA2 = {
    "model_type": "gemma2", "hidden_size": 48, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 12, "num_hidden_layers": 2, "vocab_size": 50257,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 12, "sliding_window": 16,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
}
GEMMA3_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}


def _rope(**changes) -> dict:
    return {"rope_parameters": {**LLAMA["rope_parameters"], **changes}}


@pytest.mark.parametrize("base, changes, message", [
    # a NaN or infinite rotary base loaded and gave finite logits 2-8 off; 0 became 10000; "abc" a traceback
    (LLAMA, _rope(rope_theta=math.nan), "rope_parameters.rope_theta must be a finite positive number, but it is nan"),
    (LLAMA, _rope(rope_theta=math.inf), "rope_parameters.rope_theta must be a finite positive number, but it is inf"),
    (LLAMA, _rope(rope_theta=0), "rope_parameters.rope_theta must be a finite positive number, but it is 0"),
    (LLAMA, _rope(rope_theta="abc"), "rope_parameters.rope_theta must be a finite positive number, but it is 'abc' "
                                     "(a string)"),
    (LLAMA, {"rope_parameters": None, "rope_theta": math.nan}, "rope_theta must be a finite positive number"),
    (LLAMA, {"rope_parameters": [500.0]}, "rope_parameters must be an object of rotary parameters"),
    (LLAMA, {"rope_parameters": {**LLAMA3, "factor": 0}}, "rope_parameters.factor must be a finite positive number"),
    (LLAMA, {"rope_parameters": {**LLAMA3, "low_freq_factor": "1"}}, "rope_parameters.low_freq_factor must be a "
                                                                     "finite positive number"),
    (LLAMA, {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": 64.5}},
     "rope_parameters.original_max_position_embeddings must be a whole number of at least 1"),
    (LLAMA, {"rope_parameters": None, "rope_scaling": {**LLAMA3, "high_freq_factor": math.inf}},
     "rope_scaling.high_freq_factor must be a finite positive number"),
    (LLAMA, {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "mscale": -1.0}},
     "rope_parameters.mscale must be a finite number of at least 0"),
    (LLAMA, {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "truncate": "no"}},
     "rope_parameters.truncate must be true or false"),
    (LLAMA, _rope(partial_rotary_factor=1.5), "rope_parameters.partial_rotary_factor must be a number in (0, 1]"),
    (LLAMA, {"rms_norm_eps": math.nan}, "rms_norm_eps must be a finite positive number, but it is nan"),
    (LLAMA, {"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false (a JSON boolean, without "
                                              "quotes), but it is 'false' (a string)"),
    (GEMMA2, {"attn_logit_softcapping": math.inf}, "attn_logit_softcapping must be a finite positive number"),
    (GEMMA2, {"final_logit_softcapping": -30.0}, "final_logit_softcapping must be a finite positive number"),
    (GEMMA2, {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar must be a finite positive number"),
    (GEMMA2, {"model_type": "gemma3_text", "rope_parameters": {**GEMMA3_ROPE, "sliding_attention": {
        "rope_type": "default", "rope_theta": math.nan}}},
     "rope_parameters.sliding_attention.rope_theta must be a finite positive number"),
], ids=lambda value: None)
def test_config_numbers(tmp_path: Path, base: dict, changes: dict, message: str):
    (tmp_path / "config.json").write_text(json.dumps({**base, **changes}))
    with pytest.raises(resid.ResidError) as err:
        resid.load(tmp_path)
    assert message in str(err.value) and "Fix that field of config.json" in str(err.value), str(err.value)


def test_a_config_built_in_python_refuses_non_finite_numbers():
    # loaders other than config.json's (GGUF metadata, a researcher's own ModelConfig) meet the same rule
    with pytest.raises(resid.ResidError, match=r"rotary_base=nan must be a finite positive number; .*"
                                               r"attn_softcap=0.0 must be a finite positive number"):
        resid.ModelConfig("llama", 8, 1, 2, 2, 4, 8, 10, 8, "rmsnorm", 1e-6, rotary_base=math.nan, attn_softcap=0.0)
    with pytest.raises(resid.ResidError, match=r"rope_scaling.factor=inf must be a finite positive number"):
        resid.ModelConfig("llama", 8, 1, 2, 2, 4, 8, 10, 8, "rmsnorm", 1e-6,
                          rope_scaling=resid.RopeScaling("linear", math.inf))


@pytest.mark.parametrize("files, message", [
    ({"config.json/": None}, "config.json is a folder, not a file; config.json must be the JSON file"),
    ({"config.json": "[1, 2]"}, "config.json holds a JSON list, not the JSON object config.json is"),
    ({"config.json": json.dumps(LLAMA), "model.safetensors.index.json": "[1, 2]"},
     "model.safetensors.index.json holds a JSON list, not the JSON object"),
    ({"config.json": json.dumps(LLAMA), "model.safetensors.index.json": '{"weight_map": ["a"]}'},
     'has no "weight_map" object of tensor name -> shard file name'),
])
def test_model_folder_files(tmp_path: Path, files: dict, message: str):
    for name, text in files.items():
        if name.endswith("/"):
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_text(text)
    with pytest.raises(resid.ResidError, match="(?i)re-download") as err:
        resid.load(tmp_path)
    assert message in str(err.value), str(err.value)


# Result stores and tables: a tampered or damaged file is refused on open, naming it and what to delete.
KEYS = ["prompt", "site", "head"]


def _rows(prompts: range) -> pd.DataFrame:
    return pd.DataFrame({"prompt": list(prompts), "site": "layers[0].attn", "head": [None] * len(prompts),
                         "value": [p / 7 for p in prompts]})


def _finished(out: Path) -> None:
    store = ResultStore(out, KEYS, {"model": "m"})
    store.write(_rows(range(4)))
    store.finish()


def _unfinished(out: Path) -> Path:
    store = ResultStore(out, KEYS, {"model": "m"})
    store.write(_rows(range(4)))
    store.write(_rows(range(4, 6)))
    store.close()
    return sorted(Path(f"{out}.parts").glob("chunk-*"))[0]


def _repeat_rows(path: Path) -> None:
    frame = pd.read_parquet(path)
    frame = pd.concat([frame, frame.iloc[[1, 1]]], ignore_index=True)
    frame.to_parquet(path, index=False)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, message", [
    # duplicated rows were resumed as stored: a mean over the table changed with exit 0
    (lambda out: (_finished(out), _repeat_rows(out)),
     "sweep.parquet holds 3 rows of 1 repeated key(s) ['prompt', 'site', 'head'], e.g. (1, 'layers[0].attn', None)"),
    (lambda out: _repeat_rows(_unfinished(out)), "holds 3 rows of 1 repeated key(s)"),
    (lambda out: (_finished(out), _truncate(out)), "sweep.parquet could not be read as Parquet"),
    (lambda out: _truncate(_unfinished(out)), "could not be read as Parquet"),
    (lambda out: (_finished(out), Path(f"{out}.sweep.json").write_text("{not json")),
     "sweep.parquet.sweep.json is not readable JSON"),
    (lambda out: (_finished(out), Path(f"{out}.sweep.json").write_text("[1]")),
     "sweep.parquet.sweep.json holds a JSON list"),
    (lambda out: (_unfinished(out), Path(f"{out}.parts/signature.json").write_text('{"signature": {}}')),
     "signature.json lacks ['key_columns']"),
    (lambda out: (_unfinished(out), Path(f"{out}.parts/schema.json").unlink()),
     "holds result chunks but no schema.json"),
])
def test_result_store_files(tmp_path: Path, damage, message: str):
    out = tmp_path / "sweep.parquet"
    damage(out)
    with pytest.raises(ResidError) as err:
        ResultStore(out, KEYS, {"model": "m"}).finish()
    assert message in str(err.value) and "Delete " in str(err.value), str(err.value)


def test_a_store_resumed_after_a_crash_keeps_one_row_per_key(tmp_path: Path):
    # the control of the check above: a key in two chunks (a chunk written again after a crash) is no damage
    out = tmp_path / "sweep.parquet"
    _unfinished(out)
    store = ResultStore(out, KEYS, {"model": "m"})
    assert len(store.done()) == 6
    store.write(_rows(range(3, 6)))
    assert len(store.done()) == 6
    pd.testing.assert_series_equal(store.finish()["value"], _rows(range(6))["value"])


@pytest.mark.parametrize("damage, message", [
    (_truncate, "could not be read as Parquet"),  # no sidecar: read as pyarrow stores it
    (lambda path: Path(f"{path}.json").write_text("\ufeff{"), "is not a table sidecar"),
])
def test_table_files(tmp_path: Path, damage, message: str):
    path = tmp_path / "table.parquet"
    tables.export(_rows(range(3)), path)
    if damage is _truncate:
        Path(f"{path}.json").unlink()
    damage(path)
    with pytest.raises(ResidError, match=message):
        tables.read(path)


# Runs without logits: reading them says what to read instead (as generate refuses an embedding model).
@pytest.fixture(scope="module")
def embedding_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bert_base")
    encoder_models.build("bert_base", folder)
    return folder


def test_an_embedding_models_run_has_no_silent_none_logits(embedding_model: Path, capsys):
    model = resid.load(embedding_model)
    run = model.run("the cat sat")
    assert not run.has_logits and run.hidden.shape[-1] == model.config.d_model
    with pytest.raises(ResidError, match=r"is an embedding model \(no LM head\), so its runs have no logits\. Read "
                                         r"run\.hidden.*or run\.stream\.final\(\)"):
        run.logits
    assert main(["predict", "the cat", "--model", str(embedding_model)]) == 2
    err = capsys.readouterr().err
    assert "is an embedding model (no LM head, no logits). Pass a language model" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_run_cut_short_names_its_stop():
    part = make_random_model("llama_gqa").run(torch.tensor([[1, 2, 3]]), stop_at_layer=1)
    with pytest.raises(ResidError, match=r"stopped before layer 1 \(stop_at_layer\), so it has no logits. Read "
                                         r"run\.hidden"):
        part.logits
    with pytest.raises(ResidError, match=r"logits\.token\[3\]: This run stopped before layer 1"):
        part.read(resid.Site.parse("logits.token[3]"))


@pytest.mark.parametrize("label", ["layers[" + "9" * 5000 + "].attn", "layers[3].attn.head[" + "1" * 5000 + "]",
                                   "logits.token[" + "7" * 5000 + "]", "layers[3].attn@" + "2" * 5000])
def test_site_labels_with_huge_indices(label: str):
    # int() of more than 4,300 digits raises a ValueError; the label grammar bounds the digits first
    with pytest.raises(ResidError, match="site label|positions after '@' must be integers"):
        resid.Site.parse(label)


# Graphs and feature scans: nothing to trace, nothing that fires, and activations that are not numbers.
def test_a_graph_of_a_prompt_where_no_feature_fires_is_its_errors_tokens_and_logits(tmp_path: Path):
    model = make_random_model("llama_gqa")
    dead = per_layer(model)
    for transcoder in dead:
        transcoder.b_enc.data -= 100.0  # no feature fires anywhere (max() of no targets was a traceback)
    graph = graphs.attribute(model, [11, 5, 7], dead)
    assert graph.n_features == 0 and len(graph.active_features) == 0 and graph.n_logits > 0
    kinds = set(graph.to_frame()["kind"])
    assert kinds == {"error", "token", "logit"}, kinds
    replacement, completeness = graph.scores()
    assert 0 <= replacement <= 1 and 0 <= completeness <= 1
    assert json.loads(Path(graphs.write_json(graph, tmp_path / "g.json")).read_text())["nodes"]


def test_an_empty_prompt_is_refused(capsys):
    model = make_random_model("llama_gqa")
    with pytest.raises(ResidError, match="The prompt is empty: an attribution graph traces the prediction"):
        graphs.attribute(model, "", per_layer(model))
    assert main(["graph", "", "--transcoders", ".", "--model", "no-model-is-loaded"]) == 2
    err = capsys.readouterr().err
    assert "The prompt is empty: resid graph traces" in err and len(err.strip().splitlines()) == 1, err


def test_nan_activations_are_refused_naming_the_dictionary(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    sae = random_dictionary(model, "blocks.1.hook_resid_pre", name="broken")
    sae.W_enc.data[:, 3] = math.nan  # the histogram's bin of a NaN was an IndexError
    with pytest.raises(ResidError, match=r"Dictionary 'broken' gives non-finite activations \(NaN or infinity\) "
                                         r"for feature\(s\) \[3\] on the scanned tokens"):
        features.top_activating(model, sae, ["The cat sat on the mat."], k=2)


def test_features_that_never_fired_are_named(gpt2_tokenizer):
    model = make_random_model("llama_gqa", gpt2_tokenizer)
    sae = random_dictionary(model, "blocks.1.hook_resid_pre", name="sae")
    sae.b_enc.data[[2, 5]] = -1e4  # off at every token
    df = features.top_activating(model, sae, ["The cat sat on the mat."], features=[1, 2, 5, 7], k=2)
    silent = [resid.Site(1, "resid_pre", feature=f).label for f in (2, 5)]
    assert df.attrs["never_fired"] == silent and not set(df["site"]) & set(silent) and len(set(df["site"])) == 2
    tokens = df.attrs["provenance"]["parameters"]["tokens"]
    assert notes(df) == [f"note: 2 of the 4 features scanned never fired (activation 0 at all {tokens} scanned "
                         f"tokens), so the table has no rows for them: {silent[0]}, {silent[1]} "
                         "(df.attrs['never_fired'] lists them all)."]


def test_an_image_without_kaleido_names_the_extra(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kaleido", None)  # as where kaleido is not installed (find_spec: None)
    with pytest.raises(ResidError, match=r"Saving fig\.png needs kaleido.*pip install 'resid-stream\[figures\]'"):
        plots.save_image(go.Figure(), tmp_path / "fig.png")
    with pytest.raises(ResidError, match=r"Cannot save a figure as 'fig\.gif'"):
        plots.save_image(go.Figure(), tmp_path / "fig.gif")


@pytest.mark.parametrize("kind", ["sae", "clt"])
def test_dictionary_activations_are_zero_at_padding(kind: str):
    # left padding gave pad tokens feature activations in run.dictionaries[...].acts
    model = make_random_model("llama_gqa")
    dictionary = (cross_layer(model) if kind == "clt" else
                  random_dictionary(model, "blocks.1.hook_resid_pre", name="sae", d_sae=40))
    short, long = [4, 9, 2], [7, 3, 8, 1, 5, 6]
    batch = resid.Tokens.pad([short, long], 0, "left")
    for mode in (dictionary, Splice(dictionary, error=False)):
        acts = model.run(batch, dictionaries=[mode]).dictionaries[dictionary.name].acts
        alone = model.run(torch.tensor([short]), dictionaries=[mode]).dictionaries[dictionary.name].acts
        if kind == "clt":  # [layer batch pos feature]: the layers in front
            acts, alone = acts.movedim(0, 2), alone.movedim(0, 2)
        assert acts.shape[:2] == (2, 6) and not bool(acts[0, :3].ne(0).any()), "the padding of the short prompt"
        torch.testing.assert_close(acts[0, 3:], alone[0], atol=1e-5, rtol=1e-5)
