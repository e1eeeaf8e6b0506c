"""A dictionary that does not fit the model is refused with one error naming both sides (wrong width, a hook
that is not a site of this model, another model's name); files resid does not fully understand are refused by
name (unknown config fields or tensors, pickles)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from random_models import make_random_model
from safetensors.torch import load_file, save_file

import resid
import resid.dictionaries
from resid.dictionaries.check import parse_name, same_model

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"


@pytest.fixture(scope="module")
def model() -> resid.Transformer:
    """d_model 32, 3 layers, named like the fixtures' "tiny-random-llama"."""
    return make_random_model("llama_gqa")


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / Path(name).name))


def edit_json(path: Path, **changes) -> None:
    found = json.loads(path.read_text())
    metadata = changes.pop("metadata", None)
    found.update(changes)
    if metadata:
        found["metadata"].update(metadata)
    path.write_text(json.dumps(found))


def widened(name: str, tmp_path: Path, d_in: int = 32, **cfg) -> Path:
    """A SAELens fixture re-cut to d_in (so that it fits the 32-wide model), with cfg.json changes."""
    folder = copy(name, tmp_path)
    weights = load_file(str(folder / "sae_weights.safetensors"))
    cut = {"W_enc": lambda v: v[:d_in], "b_dec": lambda v: v[:d_in], "W_dec": lambda v: v[:, :d_in]}
    weights = {k: cut.get(k, lambda v: v)(v).contiguous() for k, v in weights.items()}
    save_file(weights, str(folder / "sae_weights.safetensors"))
    edit_json(folder / "cfg.json", d_in=d_in, **cfg)
    return folder


def test_a_fitting_dictionary_loads_and_records_its_site(model, tmp_path) -> None:
    sae = resid.dictionaries.load(widened("saelens/standard", tmp_path), model)
    assert sae.site_in == sae.site_out == resid.Site(1, "resid_post")
    run = model.run(torch.randint(0, 97, (2, 5)), capture=resid.Capture.of([sae.site_in]))
    acts, recon = sae(run.read(sae.site_in))
    assert acts.shape == (2, 5, 16) and recon.shape == (2, 5, 32)


def test_wrong_width_is_refused_naming_both_sides(model) -> None:
    with pytest.raises(resid.ResidError, match=r"d_in=48.*'blocks.1.hook_resid_post'.*layers\[1\].resid_post.*32 wide"):
        resid.dictionaries.load(DATA / "saelens" / "standard", model)


@pytest.mark.parametrize("hook, why", [
    ("blocks.7.hook_resid_post", r"layer 7 is out of range; the model has 3 layers"),
    ("blocks.0.hook_embed_typo", r"does not map to a site"),
    ("blocks.1.attn.hook_pattern", r"per-head tensor"),
    ("model.layers.0.post_feedforward_layernorm.output", r"post-norm, which this model does not have"),
])
def test_a_hook_that_is_no_site_of_the_model_is_refused(model, tmp_path, hook, why) -> None:
    folder = widened("saelens/standard", tmp_path, metadata={"hook_name": hook})
    with pytest.raises(resid.ResidError, match=why) as error:
        resid.dictionaries.load(folder, model)
    assert repr(hook) in str(error.value)


def test_resid_mid_of_a_parallel_model_is_refused(tmp_path) -> None:
    parallel = make_random_model("neox_parallel")
    folder = widened("saelens/layer_norm", tmp_path)  # hook blocks.1.hook_resid_mid
    with pytest.raises(resid.ResidError, match=r"'blocks.1.hook_resid_mid'.*parallel blocks have no resid_mid"):
        resid.dictionaries.load(folder, parallel)


def test_another_models_name_is_refused_naming_both(model, tmp_path) -> None:
    folder = widened("saelens/standard", tmp_path, metadata={"model_name": "google/gemma-2-2b"})
    with pytest.raises(resid.ResidError, match=r"trained on 'google/gemma-2-2b', but the model is 'random-llama_gqa'"):
        resid.dictionaries.load(folder, model)


@pytest.mark.parametrize("a, b, same", [
    ("google/gemma-2-2b", "gemma-2-2b", True), ("google/gemma-2-2b", "/models/gemma-2-2b-it", True),
    ("HuggingFaceTB/SmolLM2-135M", "smollm2-135m", True), ("gpt2-small", "gpt2", True),
    ("gemma-v3-1b-pt", "google/gemma-3-1b-pt", True), ("tiny-random-llama", "checkpoints/tiny_llama0", True),
    ("meta-llama/Llama-3.2-1B", "llama-3.2-1b-instruct", True), ("EleutherAI/pythia-70m-deduped", "pythia-70m", True),
    ("google/gemma-2-2b", "gemma-2-9b", False), ("google/gemma-2-2b", "google/gemma-3-1b-pt", False),
    ("google/gemma-2-2b", "smollm2-135m", False), ("gpt2-small", "gpt2-medium", False),
    ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", False), ("pythia-70m", "pythia-160m", False),
])
def test_model_names_compare_loosely(a, b, same) -> None:
    assert same_model(a, b) == same, (parse_name(a), parse_name(b))


@pytest.mark.parametrize("name, config, field", [
    ("saelens/standard", "cfg.json", "use_ghost_grads_v2"),
    ("sparsify/layers.1", "cfg.json", "signed"),
    ("gemma_scope_2/sae", "config.json", "rescale"),
    ("circuit_tracer/clt", "config.yaml", "feature_scale"),
])
def test_unknown_config_fields_are_refused_by_name(tmp_path, name, config, field) -> None:
    folder = copy(name, tmp_path)
    path = folder / config
    if config.endswith(".yaml"):
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), field: 2}))
    else:
        edit_json(path, **{field: 2})
    with pytest.raises(resid.ResidError, match=rf"field\(s\) resid does not know.*{field}=2"):
        resid.dictionaries.load(folder)


def test_unknown_and_missing_tensors_are_refused_by_name(tmp_path) -> None:
    folder = copy("saelens/jumprelu", tmp_path)
    weights = load_file(str(folder / "sae_weights.safetensors"))
    weights["W_feature_scale"] = torch.ones(16)
    del weights["threshold"]
    save_file(weights, str(folder / "sae_weights.safetensors"))
    with pytest.raises(resid.ResidError, match=r"missing \['threshold'\]; unknown \['W_feature_scale'\]"):
        resid.dictionaries.load(folder)


def test_unsupported_settings_are_refused(tmp_path) -> None:
    folder = copy("saelens/topk", tmp_path)
    edit_json(folder / "cfg.json", rescale_acts_by_decoder_norm=True, architecture="standard")
    with pytest.raises(resid.ResidError, match="rescale_acts_by_decoder_norm=True is a setting of SAELens's TopK"):
        resid.dictionaries.load(folder)
    edit_json(folder / "cfg.json", rescale_acts_by_decoder_norm=False, architecture="matching_pursuit")
    with pytest.raises(resid.ResidError, match="architecture 'matching_pursuit' is not one resid computes"):
        resid.dictionaries.load(folder)
    with pytest.raises(resid.ResidError,
                       match=r"pass it: resid\.dictionaries\.load\(path, norm_scaling_factor=\.\.\.\)"):
        resid.dictionaries.load(DATA / "saelens" / "expected_average")


def test_pickles_are_never_loaded(tmp_path) -> None:
    (tmp_path / "sae.pt").write_bytes(b"not read")
    with pytest.raises(resid.ResidError, match=r"\['sae.pt'\]: resid never unpickles"):
        resid.dictionaries.load(tmp_path)


def test_a_file_without_its_hook_needs_one(model, tmp_path) -> None:
    with pytest.raises(resid.ResidError, match="does not say which hook it reads.*hook="):
        resid.dictionaries.load(DATA / "gemma_scope_1" / "sae", model)
    sae = resid.dictionaries.load(DATA / "gemma_scope_1" / "sae", hook="blocks.1.hook_resid_post")
    assert sae.site_in == resid.Site(1, "resid_post")
    with pytest.raises(resid.ResidError, match="may only fill in a hook the file does not say"):
        resid.dictionaries.load(DATA / "saelens" / "standard", hook="blocks.0.hook_resid_pre")


def test_decode_needs_the_input_with_a_skip_path() -> None:
    transcoder = resid.dictionaries.load(DATA / "saelens" / "skip_transcoder")
    with pytest.raises(resid.ResidError, match=r"skip path \(W_skip\), so decode needs the input too"):
        transcoder.decode(torch.zeros(2, 16))


def test_a_hub_id_offline_is_a_clear_error() -> None:
    with pytest.raises(resid.ResidError, match="Could not fetch the dictionary 'nobody/no-such-sae'.*local path"):
        resid.dictionaries.load("nobody/no-such-sae/layer_3")


def tiny(kind: str) -> resid.Transformer:
    """The shapes the fixtures were made for: d_model 48 (4 heads of 12), 2 layers; Llama-like or Gemma-3-like."""
    config = dict(architecture=kind, d_model=48, n_layers=2, n_heads=4, n_kv_heads=4, d_head=12, d_mlp=96, d_vocab=97,
                  n_ctx=64, norm="rmsnorm", norm_eps=1e-6)
    if kind == "gemma3":
        config.update(norm_gain_offset=1.0, post_norms=True, qk_norm="head", act="gelu_new")
    return resid.Transformer(resid.ModelConfig(**config), name=f"tiny-random-{'gemma-3' if kind == 'gemma3' else kind}")


@pytest.mark.parametrize("name", sorted(json.loads((DATA / "manifest.json").read_text())["fixtures"]))
def test_every_fixture_fits_the_model_it_was_made_for(name: str) -> None:
    entry = json.loads((DATA / "manifest.json").read_text())["fixtures"][name]
    model = tiny("gemma3" if name.startswith("gemma_scope_2") else "llama")
    factor = 2.5 if name.endswith("expected_average") else None
    loaded = resid.dictionaries.load(DATA / entry["folder"], model, hook=entry.get("hook"), norm_scaling_factor=factor)
    if isinstance(loaded, resid.dictionaries.CrossLayerTranscoder):
        assert [p.site for p in loaded.points_in] == [resid.Site(0, "resid_mid"), resid.Site(1, "resid_mid")]
        assert [p.site for p in loaded.points_out] == [resid.Site(0, "mlp"), resid.Site(1, "mlp")]
        return
    dictionaries = loaded if isinstance(loaded, list) else [loaded]
    for dictionary in dictionaries:
        assert dictionary.site_in is not None and dictionary.site_out is not None
        assert (dictionary.site_in != dictionary.site_out) == dictionary.is_transcoder
    if dictionaries[0].model_name is None:  # sparsify and Gemma Scope 1 files do not say their model
        assert entry["format"] in ("sparsify", "gemma_scope")
        return
    other = tiny("llama" if name.startswith("gemma_scope_2") else "gemma3")  # the other family refuses it
    with pytest.raises(resid.ResidError, match="trained on"):
        resid.dictionaries.load(DATA / entry["folder"], other, hook=entry.get("hook"), norm_scaling_factor=factor)


def test_a_cross_layer_transcoder_must_span_the_model(model) -> None:
    with pytest.raises(resid.ResidError, match="spans 2 layers, but model 'random-llama_gqa' has 3"):
        resid.dictionaries.load(DATA / "circuit_tracer" / "clt", model)


def test_embedding_hooks_map_where_the_model_has_them(model) -> None:
    assert resid.dictionaries.hook_point("hook_embed", model.config).site == resid.Site(None, "embed")
    with pytest.raises(resid.ResidError, match="no positional embedding write"):
        resid.dictionaries.hook_point("hook_pos_embed", model.config)


def test_a_dictionary_trained_on_transformerlens_processing_is_refused(tmp_path) -> None:
    layernorm = make_random_model("gpt2_like")
    folder = widened("saelens/standard", tmp_path, metadata={"model_from_pretrained_kwargs": {
        "center_writing_weights": True}, "model_name": "random-gpt2_like"})
    with pytest.raises(resid.ResidError, match=r"center_writing_weights=True.*blocks.1.hook_resid_post"):
        resid.dictionaries.load(folder, layernorm)
    edit_json(folder / "cfg.json", metadata={"model_from_pretrained_kwargs": {"center_writing_weights": False}})
    assert resid.dictionaries.load(folder, layernorm).site_in == resid.Site(1, "resid_post")
    # z (read by its Site, attn field z) is not a write, so centring leaves it alone; folding value biases does not
    edit_json(folder / "cfg.json", metadata={"hook_name": "blocks.1.attn.hook_z",
                                             "model_from_pretrained_kwargs": {"center_writing_weights": True}})
    assert resid.dictionaries.load(folder, layernorm).site_in == resid.Site(1, "attn", field="z")
    edit_json(folder / "cfg.json", metadata={"model_from_pretrained_kwargs": {"fold_value_biases": True}})
    with pytest.raises(resid.ResidError, match=r"fold_value_biases=True.*blocks.1.attn.hook_z"):
        resid.dictionaries.load(folder, layernorm)
