"""SAELens release names -> Hub files (resid.dictionaries.releases) and load(release, sae_id=...), offline: the Hub
fetch is replaced by a recorder that hands back a committed fixture folder, so the test checks the repo id and
folder the download is asked for, and that the folder is then read as its format with the registry's hook."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bad_option import BAD_OPTION

import resid
import resid.dictionaries
from resid.dictionaries import hub, releases

DATA = Path(__file__).resolve().parents[1] / "data" / "dictionaries"


@pytest.fixture
def table(monkeypatch) -> None:
    """resid's own table, as without sae-lens installed (whether or not it is)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sae_lens" else real(name, *a))


@pytest.fixture
def fetched(monkeypatch) -> list:
    """Every hub.folder call, answered with a local fixture folder chosen by the test (calls[0] is that folder)."""
    calls: list = []

    def fake(repo_id: str, subfolder: str | None) -> Path:
        calls.append((repo_id, subfolder))
        return calls[0]

    monkeypatch.setattr(hub, "folder", fake)
    return calls


@pytest.mark.parametrize(("release", "sae_id", "repo_id", "path", "fmt", "hook"), [
    ("gemma-scope-2b-pt-res-canonical", "layer_12/width_16k/canonical", "google/gemma-scope-2b-pt-res",
     "layer_12/width_16k/average_l0_82", "gemma_scope", "blocks.12.hook_resid_post"),
    ("gemma-scope-2b-pt-mlp-canonical", "layer_3/width_16k/canonical", "google/gemma-scope-2b-pt-mlp",
     None, "gemma_scope", "blocks.3.hook_mlp_out"),
    ("gemma-scope-2-1b-pt-res", "layer_13_width_16k_l0_medium", "google/gemma-scope-2-1b-pt",
     "resid_post/layer_13_width_16k_l0_medium", "gemma_scope", None),
    ("gpt2-small-res-jb", "blocks.8.hook_resid_pre", "jbloom/GPT2-Small-SAEs-Reformatted", "blocks.8.hook_resid_pre",
     "saelens", None),
    ("llama_scope_lxr_8x", "l0r_8x", "fnlp/Llama3_1-8B-Base-LXR-8x", "Llama3_1-8B-Base-L0R-8x", "llama_scope", None),
])
def test_main_releases_resolve_from_resids_table(table, release, sae_id, repo_id, path, fmt, hook) -> None:
    found = releases.resolve(release, sae_id)
    assert (found.repo_id, found.format, found.hook) == (repo_id, fmt, hook)
    if path is not None:
        assert found.path == path
    assert "releases.json" in found.registry


def test_llama_scope_carries_its_norm_scaling_factor(table) -> None:
    assert releases.resolve("llama_scope_lxr_8x", "l0r_8x").norm_scaling_factor == pytest.approx(58.935251798561154)


@pytest.mark.parametrize(("release", "sae_id", "message"), [
    ("gemma-scope-2b-pt-res-canonicl", "layer_12/width_16k/canonical",
     r"'gemma-scope-2b-pt-res-canonicl' is not a SAELens release .*closest: gemma-scope-2b-pt-res-canonical"),
    ("gpt2-small-res-jb", "blocks.8.hook_resid_pro",
     r"'blocks.8.hook_resid_pro' is not a sae_id of the SAELens release 'gpt2-small-res-jb' .*closest: "
     r"blocks.8.hook_resid_pre"),
])
def test_unknown_names_list_the_closest(table, release, sae_id, message) -> None:
    with pytest.raises(resid.ResidError, match=message):
        releases.resolve(release, sae_id)


def test_installed_sae_lens_registry_is_read_as_data_never_imported(tmp_path, monkeypatch) -> None:
    package = tmp_path / "sae_lens"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('resid imported sae_lens')\n")
    (package / "pretrained_saes.yaml").write_text(
        "my-release:\n  conversion_func: null\n  repo_id: someone/my-saes\n  saes:\n"
        "  - id: blocks.1.hook_resid_post\n    path: sub/blocks.1\n    norm_scaling_factor: 2.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = releases.resolve("my-release", "blocks.1.hook_resid_post")
    assert (found.repo_id, found.path, found.format, found.norm_scaling_factor) == (
        "someone/my-saes", "sub/blocks.1", "saelens", 2.5)
    assert found.registry == str(package / "pretrained_saes.yaml")
    with pytest.raises(resid.ResidError, match="not a SAELens release"):  # the table is not consulted then
        releases.resolve("gpt2-small-res-jb", "blocks.8.hook_resid_pre")


@pytest.mark.parametrize(("text", "message"), [
    ("- a\n- b\n", "not a mapping of release names"),
    ("r:\n  saes: []\n", "release 'r' has no repo_id"),
    ("r:\n  repo_id: a/b\n  saes:\n  - id: 5\n    path: p\n", "without a string id and path"),
    ("r:\n  repo_id: a/b\n  saes:\n  - {id: x, path: p, norm_scaling_factor: big}\n", "norm_scaling_factor"),
    ("r: [unclosed\n", "could not be read"),
])
def test_a_broken_installed_registry_is_one_error(tmp_path, monkeypatch, text, message) -> None:
    (tmp_path / "sae_lens").mkdir()
    (tmp_path / "sae_lens" / "pretrained_saes.yaml").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(resid.ResidError, match=message):
        releases.resolve("r", "x")


def test_load_by_release_fetches_the_resolved_folder_and_reads_it(table, fetched) -> None:
    fetched.append(DATA / "saelens" / "standard")
    loaded = resid.dictionaries.load("gpt2-small-res-jb", sae_id="blocks.8.hook_resid_pre")
    assert fetched[1:] == [("jbloom/GPT2-Small-SAEs-Reformatted", "blocks.8.hook_resid_pre")]
    local = resid.dictionaries.load(DATA / "saelens" / "standard")
    assert loaded.hook_in == local.hook_in and bool((loaded.W_enc == local.W_enc).all())


def test_load_by_release_gives_gemma_scope_1_its_hook(table, fetched) -> None:
    fetched.append(DATA / "gemma_scope_1" / "sae")
    loaded = resid.dictionaries.load("gemma-scope-2b-pt-res-canonical", sae_id="layer_12/width_16k/canonical")
    assert fetched[1:] == [("google/gemma-scope-2b-pt-res", "layer_12/width_16k/average_l0_82")]
    assert (loaded.hook_in, loaded.hook_out) == ("blocks.12.hook_resid_post", "blocks.12.hook_resid_post")


@pytest.mark.parametrize("repo, path, site, expected", [
    ("google/gemma-scope-2b-pt-res", "layer_3/width_16k/average_l0_82", "layers[3].resid_post",
     "blocks.3.hook_resid_post"),
    ("google/gemma-scope-2b-pt-mlp", "layer_5/width_16k/average_l0_82", "layers[5].mlp", "blocks.5.hook_mlp_out"),
    ("google/gemma-scope-2b-pt-att", "layer_7/width_16k/average_l0_82", "layers[7].attn.z", "blocks.7.attn.hook_z"),
    ("google/gemma-scope-2b-pt-res", "embedding/width_4k/average_l0_6", "embed", "hook_embed"),
])
def test_gemma_scope_1_hooks_are_the_hook_names_of_their_sites(repo, path, site, expected) -> None:
    # the names SAELens's loader gives these folders, derived from the Sites they read
    hook = releases._gemma_scope_1_hook(repo, path)
    assert hook == expected and resid.Site.from_hook_name(hook) == resid.Site.parse(site)


def test_load_by_release_refuses_formats_resid_does_not_read_before_downloading(table, fetched) -> None:
    with pytest.raises(resid.ResidError, match=r"fnlp/Llama3_1-8B-Base-LXR-8x, a llama_scope folder"):
        resid.dictionaries.load("llama_scope_lxr_8x", sae_id="l0r_8x")
    assert fetched == []


def test_a_sae_id_in_the_models_place_is_pointed_to_sae_id(table, fetched) -> None:
    with pytest.raises(resid.ResidError, match=r"second argument is the model.*sae_id='blocks.8.hook_resid_pre'"):
        resid.dictionaries.load("gpt2-small-res-jb", "blocks.8.hook_resid_pre")
    assert fetched == []


def test_an_int_sae_id_is_one_clear_error() -> None:
    """sae_id=12 (an int where SAELens names ids by strings) was a TypeError from deep inside the name matching: it
    is refused by name, by the type checks when they are on (as here) and by load itself for everyone else."""
    with pytest.raises(BAD_OPTION, match="sae_id"):
        resid.dictionaries.load("gemma-scope-2b-pt-res-canonical", sae_id=12)
    code = "import resid.dictionaries\nresid.dictionaries.load('gemma-scope-2b-pt-res-canonical', sae_id=12)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "RESID_TYPECHECK": "0"})
    assert found.stderr.strip().splitlines()[-1] == (
        "resid.errors.ResidError: sae_id=12 is not a string (int): a SAELens sae_id is a string such as "
        "'layer_12/width_16k/canonical' or 'blocks.8.hook_resid_pre'; pass it as the release's registry names it.")
