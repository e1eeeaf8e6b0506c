"""Tuned lenses on disk: a lens written by the tuned-lens package (tests/data/tuned-lens, made by
tests/data/make_tuned_lens_reference.py in tuned-lens's own environment) loads and gives tuned-lens's logits at
every layer; both layouts round-trip exactly; params.pt is read with torch.load(weights_only=True), so a pickle that
would run code is refused without running it; wrong files fail with one clear error."""

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import resid
from resid.analyses import logit_lens, tuned_lens
from resid.analyses.lenses import LogitLens, Translators, formats

DATA = Path(__file__).resolve().parents[1] / "data"  # tests/data

FIXTURE = DATA / "tuned-lens"


@pytest.fixture(scope="module")
def model() -> resid.Transformer:
    return resid.load(FIXTURE / "model")


@pytest.fixture(scope="module")
def reference() -> dict:
    return load_file(str(FIXTURE / "reference.safetensors"))


def random_translators(model: resid.Transformer, every: str = "layer", bias: bool = True) -> Translators:
    sites = logit_lens.site_list(model, every)[:-1]
    generator = torch.Generator().manual_seed(3)
    d = model.config.d_model
    return Translators(tuple(sites), torch.randn(len(sites), d, d, generator=generator),
                       torch.randn(len(sites), d, generator=generator) if bias else None, every,
                       {"model": model.name, "unembed_hash": formats.unembed_hash(model)})


@torch.no_grad()
def test_a_lens_written_by_tuned_lens_gives_its_logits(model, reference):
    lens = tuned_lens.read(model, FIXTURE / "lens")
    run = model.run(reference["input_ids"])
    inputs = list(run.stream.running("layer"))[:-1]
    assert [site for site, _ in inputs] == list(lens.translators.sites)
    for i, (site, resid_) in enumerate(inputs):  # tuned-lens's translator i reads hidden_states[i]
        torch.testing.assert_close(lens.logits(resid_, site), reference["tuned_logits"][i], atol=1e-5, rtol=0)
        torch.testing.assert_close(LogitLens(model).logits(resid_, site), reference["logit_logits"][i],
                                   atol=1e-5, rtol=0)
    assert not torch.allclose(reference["tuned_logits"], reference["logit_logits"], atol=0.1)  # the lens matters


def test_tuned_lens_hash_of_the_unembedding_is_reproduced(model):
    config = json.loads((FIXTURE / "lens" / "config.json").read_text())
    assert formats.unembed_hash(model) == config["unembed_hash"]


@torch.no_grad()
def test_tuned_lens_reads_a_lens_resid_wrote(model):
    """tuned-lens itself loaded the lens resid wrote (tests/data/make_tuned_lens_reads_resid.py, in tuned-lens's
    environment) and computed logits with it: resid's logits from the same files equal tuned-lens's."""
    folder = DATA / "tuned-lens-reads-resid"
    theirs = load_file(str(folder / "reference.safetensors"))
    lens = tuned_lens.read(model, folder / "lens")
    inputs = list(model.run(theirs["input_ids"]).stream.running("layer"))[:-1]
    assert len(inputs) == theirs["tuned_logits"].shape[0] == model.config.n_layers
    for i, (site, resid_) in enumerate(inputs):
        torch.testing.assert_close(lens.logits(resid_, site), theirs["tuned_logits"][i], atol=1e-5, rtol=0)
    fixture = load_file(str(FIXTURE / "reference.safetensors"))  # tuned-lens's own lens: not the one resid wrote
    assert not torch.allclose(theirs["tuned_logits"], fixture["tuned_logits"], atol=0.1)


@pytest.mark.parametrize("layout", ["resid", "tuned-lens"])
def test_both_layouts_round_trip_exactly(model, tmp_path, layout):
    translators = random_translators(model)
    formats.write(translators, tmp_path, layout=layout)
    back = tuned_lens.read(model, tmp_path).translators.to("cpu")
    assert back.sites == translators.sites and back.every == "layer"
    assert torch.equal(back.weight, translators.weight) and torch.equal(back.bias, translators.bias)
    assert back.info["unembed_hash"] == translators.info["unembed_hash"]


def test_resid_writes_what_tuned_lens_reads(model, tmp_path):
    """The tuned-lens layout as TunedLens.from_model_and_pretrained reads it: its config keys and its state dict."""
    formats.write(random_translators(model), tmp_path, layout="tuned-lens")
    config = json.loads((tmp_path / "config.json").read_text())
    fixture = json.loads((FIXTURE / "lens" / "config.json").read_text())
    assert set(config) == set(fixture) and config["lens_type"] == "linear_tuned_lens"
    state = torch.load(tmp_path / "params.pt", weights_only=True)
    reference = torch.load(FIXTURE / "lens" / "params.pt", weights_only=True)
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in reference.items()}


def test_sublayer_translators_and_translators_without_bias_round_trip(model, tmp_path):
    translators = random_translators(model, "sublayer", bias=False)
    formats.write(translators, tmp_path)
    back = formats.read_translators(tmp_path)
    assert back.every == "sublayer" and back.bias is None and back.sites == translators.sites
    assert torch.equal(back.weight, translators.weight)
    metadata = safe_open(str(tmp_path / formats.RESID_FILE), framework="pt").metadata()
    assert json.loads(metadata["sites"]) == [site.label for site in translators.sites]
    with pytest.raises(resid.ResidError, match="one translator per layer input.*layout='resid'"):
        formats.write(translators, tmp_path / "tl", layout="tuned-lens")


def test_a_file_written_before_resid_site_is_read(model, tmp_path):
    """Metadata "level" and sites spelled "resid_post 0", as resid wrote them before resid.Site labels."""
    translators = random_translators(model, "sublayer")
    old = [f"{site.part} {site.layer}" for site in translators.sites]
    metadata = {"format": formats.FORMAT, "version": formats.VERSION, "level": "sublayer", "sites": json.dumps(old),
                "unembed_hash": "", "info": "{}"}
    save_file({"weight": translators.weight, "bias": translators.bias}, str(tmp_path / formats.RESID_FILE), metadata)
    back = formats.read_translators(tmp_path)
    assert back.sites == translators.sites and back.every == "sublayer"
    assert torch.equal(back.weight, translators.weight) and torch.equal(back.bias, translators.bias)


def test_a_tuned_lens_file_without_bias_is_read(model, tmp_path):
    d, n = model.config.d_model, model.config.n_layers
    torch.save({f"{i}.weight": torch.full((d, d), float(i)) for i in range(n)}, tmp_path / "params.pt")
    (tmp_path / "config.json").write_text(json.dumps({"d_model": d, "num_hidden_layers": n, "bias": False}))
    translators = tuned_lens.read(model, tmp_path).translators
    assert translators.bias is None and translators.weight[2, 0, 0].item() == 2.0


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_params_pt_that_would_run_code_is_refused_unrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURE / "lens" / "config.json", tmp_path / "config.json")
    with open(tmp_path / "params.pt", "wb") as handle:
        pickle.dump({"0.weight": _RunsCode()}, handle, protocol=2)
    with pytest.raises(resid.ResidError, match=r"never unpickles.*weights_only=True"):
        formats.read_translators(tmp_path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda c: {**c, "rank": 4}, r"keys resid does not know: \['rank'\]"),
    (lambda c: {**c, "lens_type": "bilinear"}, "'bilinear' lens"),
    (lambda c: {**c, "num_hidden_layers": 4}, r"should hold 8 tensors for 4 layers"),
    (lambda c: {**c, "d_model": 8}, "wrong shape or dtype for d_model=8"),
])
def test_bad_tuned_lens_files_are_one_clear_error(tmp_path, edit, message):
    shutil.copy(FIXTURE / "lens" / "params.pt", tmp_path / "params.pt")
    config = json.loads((FIXTURE / "lens" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(edit(config)))
    with pytest.raises(resid.ResidError, match=message):
        formats.read_translators(tmp_path)


def test_a_lens_of_other_weights_is_refused_unless_asked(model, tmp_path):
    shutil.copytree(FIXTURE / "lens", tmp_path / "lens")
    config = json.loads((tmp_path / "lens" / "config.json").read_text())
    (tmp_path / "lens" / "config.json").write_text(json.dumps({**config, "unembed_hash": "0" * 64}))
    with pytest.raises(resid.ResidError, match="another unembedding.*check_unembedding=False"):
        tuned_lens.read(model, tmp_path / "lens")
    assert tuned_lens.read(model, tmp_path / "lens", check_unembedding=False).name == "tuned"


def test_a_folder_without_a_lens_says_what_it_expected(tmp_path):
    with pytest.raises(resid.ResidError, match="translators.safetensors.*config.json and params.pt"):
        formats.read_translators(tmp_path)


def _config_text(text: str):
    return lambda folder: (folder / "config.json").write_bytes(text if isinstance(text, bytes) else text.encode())


def _config_field(**fields):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return edit


def _nan_in_params(folder):
    state = torch.load(folder / "params.pt", weights_only=True)
    state["1.weight"][0, 0] = float("nan")
    torch.save(state, folder / "params.pt")


@pytest.mark.parametrize("edit, message", [
    (_config_field(bias="false"), r"config.json: bias must be a boolean \(true or false, without quotes\), but it "
                                  r"is 'false'"),
    (_config_field(num_hidden_layers=10**9), r"should hold 2,000,000,000 tensors for 1,000,000,000 layers"),
    (_config_field(num_hidden_layers=0), r"config.json: num_hidden_layers must be a whole number of at least 1"),
    (_config_field(d_model=48.9), r"config.json: d_model must be a whole number of at least 1.* but it is 48.9"),
    (_config_field(unembed_hash=5), r"config.json: unembed_hash must be a string or null"),
    (_config_text("[1, 2]"), r"config.json holds a JSON list, not the object of fields"),
    (_config_text('{"d_model": 8}'.encode("utf-16")), r"config.json is not valid UTF-8 JSON"),
    (_config_text("[" * 100_000 + "]" * 100_000), r"config.json nests JSON too deeply"),
    (_nan_in_params, r"Tensor '1.weight' in .*params.pt \(the translator at layers\[0\].resid_post\) holds 1 "
                     r"non-finite value"),
])
def test_hostile_tuned_lens_files_are_one_clear_error(tmp_path, edit, message):
    shutil.copytree(FIXTURE / "lens", tmp_path / "lens")
    edit(tmp_path / "lens")
    with pytest.raises(resid.ResidError, match=message):
        formats.read_translators(tmp_path / "lens")


def _resid_file_edit(change):
    def edit(file):
        with safe_open(str(file), framework="pt") as handle:
            metadata = handle.metadata()
        tensors, metadata = change(load_file(str(file)), metadata)
        save_file(tensors, str(file), metadata=metadata)
    return edit


def _nan_bias(tensors, metadata):
    tensors["bias"][2, 1] = float("inf")
    return tensors, metadata


@pytest.mark.parametrize("edit, message", [
    (lambda file: file.write_bytes(file.read_bytes()[: file.stat().st_size // 2]),
     r"translators.safetensors is not a readable safetensors file .* it may be truncated"),
    (_resid_file_edit(_nan_bias), r"Tensor 'bias' in .*translators.safetensors \(the translator at "
                                  r"layers\[1\].resid_post\) holds 1 non-finite"),
    (_resid_file_edit(lambda t, m: ({**t, "weight": t["weight"].to(torch.int32)}, m)),
     r"Tensor 'weight' in .*translators.safetensors has dtype I32"),
    (_resid_file_edit(lambda t, m: (t, {**m, "sites": "[not json"})), r"metadata sites is not readable JSON"),
    (_resid_file_edit(lambda t, m: (t, {**m, "info": "[1]"})), r"metadata info holds a JSON list, not a dict"),
])
def test_hostile_resid_lens_files_are_one_clear_error(model, tmp_path, edit, message):
    folder = formats.write(random_translators(model), tmp_path / "lens")
    edit(folder / formats.RESID_FILE)
    with pytest.raises(resid.ResidError, match=message):
        formats.read_translators(folder)
