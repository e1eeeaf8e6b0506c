"""Damaged and hostile dictionary files, grouped by format: each is one clear ResidError naming the file and the
field or tensor, never a traceback, a silently wrong dictionary or an allocation the file cannot back. Each case
copies a committed fixture (tests/data/dictionaries) into tmp_path and damages one thing."""

import importlib
import io
import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from random_models import make_random_model
from safetensors.torch import load_file, save_file

import resid.dictionaries
from resid.errors import ResidError

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"
IDS = torch.tensor([[1, 5, 9, 2, 7]])  # a prompt in the random models' 97-token vocabulary


def edit_json(name: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        cfg = json.loads((folder / name).read_text())
        change(cfg)
        (folder / name).write_text(json.dumps(cfg))
    return edit


def set_field(name: str, field: str, value: object) -> Callable[[Path], None]:
    return edit_json(name, lambda cfg: cfg.__setitem__(field, value))


def edit_tensor(file: str, tensor: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        tensors = load_file(str(folder / file))
        tensors[tensor] = change(tensors[tensor])
        save_file(tensors, str(folder / file))
    return edit


def nan_at_0(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[0] = float("nan")
    return t


def inf_at_0(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[-1] = float("inf")
    return t


def truncate(file: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = (folder / file).read_bytes()
        (folder / file).write_bytes(data[: len(data) // 2])
    return edit


def write_text(file: str, text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / file).write_text(text)


def edit_npz(file: str, change: Callable[[dict], dict]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        with np.load(folder / file) as data:
            arrays = {name: data[name] for name in data.files}
        np.savez(folder / file, **change(arrays))  # savez pickles object arrays, as a hostile file would
    return edit


def npz_declaring(name: str, shape: tuple) -> Callable[[Path], None]:
    """An .npz whose member `name` declares `shape` in its header but holds 16 bytes."""
    def edit(folder: Path) -> None:
        with np.load(folder / "params.npz") as data:
            arrays = {key: data[key] for key in data.files}
        with zipfile.ZipFile(folder / "params.npz", "w") as archive:
            for key, array in arrays.items():
                buffer = io.BytesIO()
                if key == name:
                    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                                  "shape": shape})
                    buffer.write(b"\0" * 16)
                else:
                    np.lib.format.write_array(buffer, array)
                archive.writestr(f"{key}.npy", buffer.getvalue())
    return edit


DEEP = '{"d_in": ' + "[" * 100_000 + "]" * 100_000 + "}"

# (fixture folder, what is damaged, the message's words): each also must name the file
CASES = {
    # SAELens
    "saelens-nan-W_enc": ("saelens/standard", edit_tensor("sae_weights.safetensors", "W_enc", nan_at_0),
                          r"Tensor 'W_enc' in .*sae_weights.safetensors holds 1 non-finite"),
    "saelens-inf-threshold": ("saelens/jumprelu", edit_tensor("sae_weights.safetensors", "threshold", inf_at_0),
                              r"Tensor 'threshold' in .*sae_weights.safetensors holds 1 non-finite"),
    "saelens-int-W_dec": ("saelens/standard", edit_tensor("sae_weights.safetensors", "W_dec",
                                                          lambda t: t.to(torch.int32)),
                          r"Tensor 'W_dec' in .*sae_weights.safetensors has dtype I32, not a floating-point"),
    "saelens-truncated": ("saelens/standard", truncate("sae_weights.safetensors"),
                          r"sae_weights.safetensors is not a readable safetensors file"),
    "saelens-string-bool": ("saelens/standard", set_field("cfg.json", "apply_b_dec_to_input", "no"),
                            r"cfg.json: apply_b_dec_to_input must be a boolean \(true or false, without quotes\), "
                            r"but it is 'no'"),
    "saelens-fractional-size": ("saelens/standard", set_field("cfg.json", "d_in", 48.9),
                                r"cfg.json: d_in must be a positive whole number .* but it is 48.9"),
    "saelens-string-size": ("saelens/topk", set_field("cfg.json", "k", "4"), r"cfg.json: k must be a positive whole"),
    "saelens-dtype": ("saelens/standard", set_field("cfg.json", "dtype", "banana"),
                      r"cfg.json: dtype is 'banana', not one of the values resid reads"),
    "saelens-metadata-list": ("saelens/standard", set_field("cfg.json", "metadata", ["a"]),
                              r"cfg.json: metadata must be an object of fields"),
    "saelens-hook-name-int": ("saelens/standard", edit_json("cfg.json", lambda c: c["metadata"].update(hook_name=5)),
                              r"cfg.json \(metadata\): hook_name must be a string or null, but it is 5"),
    "saelens-architecture-list": ("saelens/standard", set_field("cfg.json", "architecture", ["standard"]),
                                  r"cfg.json: architecture must be a string"),
    "saelens-rescale-string": ("saelens/topk", set_field("cfg.json", "rescale_acts_by_decoder_norm", "false"),
                               r"cfg.json: rescale_acts_by_decoder_norm must be a boolean"),
    "saelens-head-index": ("saelens/hook_z", edit_json("cfg.json", lambda c: c["metadata"].update(
        hook_head_index=-1)), r"hook_head_index must be null or a whole number of at least 0"),
    "saelens-deep-json": ("saelens/standard", write_text("cfg.json", DEEP), r"cfg.json nests JSON too deeply"),
    "saelens-utf16": ("saelens/standard", lambda f: (f / "cfg.json").write_bytes('{"d_in": 48}'.encode("utf-16")),
                      r"cfg.json is not valid UTF-8 JSON"),
    "saelens-config-dir": ("saelens/standard", lambda f: ((f / "cfg.json").unlink(), (f / "cfg.json").mkdir()),
                           r"cfg.json cannot be read as a file"),
    # sparsify
    "sparsify-string-transcode": ("sparsify/layers.1", set_field("cfg.json", "transcode", "false"),
                                  r"cfg.json: transcode must be a boolean .* but it is 'false'"),
    "sparsify-string-skip": ("sparsify/layers.1", set_field("cfg.json", "skip_connection", 0),
                             r"cfg.json: skip_connection must be a boolean"),
    "sparsify-inf-b_dec": ("sparsify/layers.1", edit_tensor("sae.safetensors", "b_dec", inf_at_0),
                           r"Tensor 'b_dec' in .*sae.safetensors holds 1 non-finite"),
    "sparsify-nan-encoder-bias": ("sparsify/layers.1", edit_tensor("sae.safetensors", "encoder.bias", nan_at_0),
                                  r"Tensor 'encoder.bias' in .*sae.safetensors holds 1 non-finite"),
    "sparsify-activation": ("sparsify/layers.1", set_field("cfg.json", "activation", "relu"),
                            r"cfg.json: activation is 'relu', not one of the values resid reads \('topk'\)"),
    "sparsify-latents": ("sparsify/layers.1", set_field("cfg.json", "num_latents", 16.5),
                         r"cfg.json: num_latents must be a positive whole number"),
    # Gemma Scope 2
    "gemma-scope-2-string-bool": ("gemma_scope_2/sae", set_field("config.json", "affine_connection", "false"),
                                  r"config.json: affine_connection must be a boolean"),
    "gemma-scope-2-nan-threshold": ("gemma_scope_2/sae", edit_tensor("params.safetensors", "threshold", nan_at_0),
                                    r"Tensor 'threshold' in .*params.safetensors holds 1 non-finite"),
    "gemma-scope-2-width": ("gemma_scope_2/sae", set_field("config.json", "width", 16.0),
                            r"config.json: width must be a positive whole number"),
    "gemma-scope-2-hook": ("gemma_scope_2/sae", set_field("config.json", "hf_hook_point_in", ["x"]),
                           r"config.json: hf_hook_point_in must be a string or null"),
    "gemma-scope-2-l0": ("gemma_scope_2/sae", set_field("config.json", "l0", "4"), r"config.json: l0 must be null or"),
    "gemma-scope-2-architecture": ("gemma_scope_2/sae", set_field("config.json", "architecture", "topk"),
                                   r"config.json: architecture is 'topk', not one of the values resid reads"),
    # Gemma Scope 1
    "gemma-scope-1-huge-header": ("gemma_scope_1/sae", npz_declaring("b_enc", (2 * 10**9,)), r"Array 'b_enc' in "
                                  r".*params.npz declares shape \[2000000000\] \(8,000,000,000 bytes\)"),
    "gemma-scope-1-truncated": ("gemma_scope_1/sae", truncate("params.npz"), r"params.npz is not a readable .npz"),
    "gemma-scope-1-object-array": ("gemma_scope_1/sae", edit_npz("params.npz", lambda a: {
        **a, "threshold": np.array([{"x": 1}], dtype=object)}), r"Array 'threshold' in .*params.npz holds Python "
                                   r"objects, .* resid never unpickles"),
    "gemma-scope-1-nan": ("gemma_scope_1/sae", edit_npz("params.npz", lambda a: {
        **a, "b_dec": np.full_like(a["b_dec"], np.nan)}), r"Tensor 'b_dec' in .*params.npz holds 48 non-finite"),
    "gemma-scope-1-int": ("gemma_scope_1/sae", edit_npz("params.npz", lambda a: {
        **a, "W_dec": a["W_dec"].astype(np.int32)}), r"Tensor 'W_dec' in .*params.npz has dtype int32, not a float"),
    # circuit-tracer
    "circuit-tracer-nan-threshold": ("circuit_tracer/plt", edit_tensor(
        "layer_1.safetensors", "activation_function.threshold", nan_at_0),
        r"Tensor 'activation_function.threshold' in .*layer_1.safetensors holds 1 non-finite"),
    "circuit-tracer-object-npz": ("circuit_tracer/plt_gemma_scope", edit_npz("layer_0.npz", lambda a: {
        **a, "W_enc": np.array([None], dtype=object)}), r"Array 'W_enc' in .*layer_0.npz holds Python objects"),
    "circuit-tracer-truncated": ("circuit_tracer/plt", truncate("layer_0.safetensors"),
                                 r"layer_0.safetensors is not a readable safetensors file"),
    "circuit-tracer-model-name": ("circuit_tracer/plt", write_text("config.yaml", (
        "feature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\nmodel_kind: transcoder_set\n"
        "model_name: [1, 2]\n")), r"config.yaml: model_name must be a string or null"),
    "circuit-tracer-deep-yaml": ("circuit_tracer/plt", write_text("config.yaml", "[" * 100_000 + "]" * 100_000),
                                 r"config.yaml nests YAML too deeply"),
    # a "billion laughs": nine anchors of nine aliases each expand to 9^9 values wherever the value is walked
    "circuit-tracer-yaml-aliases": ("circuit_tracer/plt", write_text("config.yaml", "a0: &a0 [x, x, x, x, x, x, x, x, "
                                    "x]\n" + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
                                                     for i in range(1, 9)) + "model_kind: *a8\n"),
        r"config.yaml: line 2 refers to a YAML alias \(\*a0\)\. A transcoder set's config is read without aliases"),
    "circuit-tracer-huge-config": ("circuit_tracer/plt", write_text("config.yaml", "x: " + "y" * (1 << 20) + "\n"),
                                   r"config.yaml is 1,048,580 bytes, too large to be a transcoder set's config"),
    "clt-d_sae-differs": ("circuit_tracer/clt", lambda f: (
        edit_tensor("W_enc_1.safetensors", "W_enc_1", lambda t: t[:8])(f),
        edit_tensor("W_enc_1.safetensors", "b_enc_1", lambda t: t[:8])(f),
        edit_tensor("W_enc_1.safetensors", "threshold_1", lambda t: t[:8])(f),
        edit_tensor("W_dec_1.safetensors", "W_dec_1", lambda t: t[:8])(f)),
        r"clt: W_enc_1 has shape \[8, 48\] but W_enc_0 has \[16, 48\]; a cross-layer transcoder has the same d_sae"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_damaged_dictionary_file_is_one_clear_error(case: str, tmp_path: Path) -> None:
    fixture, damage, message = CASES[case]
    folder = tmp_path / Path(fixture).name
    shutil.copytree(DATA / fixture, folder)
    damage(folder)
    with pytest.raises(ResidError, match=message) as raised:
        resid.dictionaries.load(folder)
    assert str(folder) in str(raised.value), "the error names the file"


def test_the_undamaged_fixtures_load(tmp_path: Path) -> None:
    """The cases above damage these folders; undamaged, each loads (so each error is the damage's)."""
    for fixture in sorted({fixture for fixture, _, _ in CASES.values()}):
        shutil.copytree(DATA / fixture, tmp_path / fixture)
        assert resid.dictionaries.load(tmp_path / fixture, hook="blocks.0.hook_resid_post"
                                       if fixture.startswith("gemma_scope_1") else None) is not None


def test_a_dictionary_loaded_without_a_model_is_checked_when_a_run_attaches_it(monkeypatch) -> None:
    """Loaded without a model, the 48-wide SAE is refused by a 32-wide model's run with the width error (it was a
    raw size-mismatch RuntimeError from inside the pass). Checking returns a value and leaves the dictionary given
    unchecked, so each run checks it again; a dictionary checked for this model is never checked again."""
    sae = resid.dictionaries.load(DATA / "saelens" / "standard")
    narrow = make_random_model("llama_gqa")
    with pytest.raises(ResidError, match=r"Dictionary 'standard' \(saelens\) has d_in=48, but its hook "
                                         r"'blocks.1.hook_resid_post' reads layers\[1\].resid_post of model "
                                         r"'random-llama_gqa', which is 32 wide"):
        narrow.run(IDS, dictionaries=[sae])
    wide = make_random_model("llama_gqa", d_model=48, n_heads=4, d_head=12)
    calls = []
    checking = importlib.import_module("resid.dictionaries.check")  # the module (the package exports its function)
    real = checking.check
    monkeypatch.setattr(checking, "check", lambda d, m: calls.append(m) or real(d, m))
    for _ in range(2):
        assert wide.run(IDS, dictionaries=[sae]).dictionaries["standard"].acts.shape[-1] == 16
    assert calls == [wide, wide], "the dictionary given stays unchecked: each run checks a value of it"
    checked, calls[:] = real(sae, wide), []
    for _ in range(2):
        assert wide.run(IDS, dictionaries=[checked]).dictionaries["standard"].acts.shape[-1] == 16
    assert calls == [], "checked for this model already"
    with pytest.raises(ResidError, match="which is 32 wide"):
        narrow.run(IDS, dictionaries=[sae])


def test_an_error_shows_a_huge_value_cut_short(tmp_path: Path) -> None:
    """A config's unknown field and a wrong-typed one hold 500,000 characters: the errors name them, short."""
    folder = tmp_path / "plt"
    shutil.copytree(DATA / "circuit_tracer" / "plt", folder)
    text = (folder / "config.yaml").read_text()
    for extra, message in ((f"surprise: {'y' * 500_000}\n", r"has field\(s\) resid does not know .*: surprise='yyy"),
                           (f"model_name: [{', '.join(['1'] * 100_000)}]\n", r"model_name must be a string or null, "
                            r"but it is \[1, 1, 1, 1, 1, 1, \.\.\.\]")):
        kept = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("model_name"))
        (folder / "config.yaml").write_text(kept + extra)
        with pytest.raises(ResidError, match=message) as raised:
            resid.dictionaries.load(folder)
        assert len(str(raised.value)) < 1000, str(raised.value)[:2000]
