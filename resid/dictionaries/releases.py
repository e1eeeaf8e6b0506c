"""SAELens's release names resolved to files on the Hugging Face Hub, so that
`resid.dictionaries.load(release, sae_id=...)` reads what SAELens's `SAE.from_pretrained(release, sae_id)` reads.

Glossary:

    release    a set of dictionaries as SAELens names it ("gemma-scope-2b-pt-res-canonical", "gpt2-small-res-jb")
    sae_id     one dictionary of a release ("layer_12/width_16k/canonical", "blocks.8.hook_resid_pre")
    repo_id    the Hub repo that holds it; `path` the folder inside that repo
    format     what that folder holds, as resid.dictionaries.load names formats ("saelens", "gemma_scope"), or
               "llama_scope" and "sae-lens:<loader>" for layouts that only SAELens's own loaders read
    registry   SAELens's table of releases, pretrained_saes.yaml

Where the registry comes from: the pretrained_saes.yaml of the installed sae-lens, read as data (sae-lens is found,
never imported: importing it imports TransformerLens, and its loaders download); without sae-lens, releases.json
beside this module, the main releases (Gemma Scope 1 and 2 canonical sets, GPT-2 small res-jb, Llama Scope) copied
from sae-lens's pretrained_saes.yaml (MIT licence; version and date in the file) by
tests/data/make_dictionary_reference.py --releases.
"""

import difflib
import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from resid.errors import ResidError
from resid.sites import Site

TABLE = Path(__file__).with_name("releases.json")
# SAELens's conversion_func (the loader it runs on the Hub folder) -> the format resid reads that folder as
FORMATS = {None: "saelens", "gemma_2": "gemma_scope", "gemma_3": "gemma_scope", "llama_scope": "llama_scope",
           "llama_scope_r1_distill": "llama_scope"}
READABLE = ("saelens", "gemma_scope")  # the formats above that resid.dictionaries.load reads
# Gemma Scope 1's kinds of site (from its repos' names: gemma-scope-2b-pt-res, -mlp, -att) -> the Site of a layer
# they read, whose TransformerLens hook name (resid.sites.transformerlens) SAELens's loader gives the folder
GEMMA_SCOPE_SITES = {"res": lambda layer: Site(layer, "resid_post"), "mlp": lambda layer: Site(layer, "mlp"),
                     "att": lambda layer: Site(layer, "attn", field="z")}


@dataclass(frozen=True)
class Resolved:
    """Where one dictionary of a SAELens release lives, and what SAELens's loader adds to the folder's files."""

    release: str
    sae_id: str
    repo_id: str
    path: str
    format: str
    hook: str | None  # the hook SAELens's loader gives a file that does not name it (Gemma Scope 1)
    norm_scaling_factor: float | None  # SAELens's registry factor for "expected_average_only_in" dictionaries
    registry: str  # which registry said so


def resolve(release: str, sae_id: str) -> Resolved:
    """The Hub repo, folder and format of `sae_id` in SAELens's `release`; an unknown name is one error that lists
    the closest known ones."""
    releases, source = registry()
    if release not in releases:
        raise ResidError(f"{release!r} is not a SAELens release in {source}{_close(release, releases)}. Pass a "
                         "release name as SAELens's SAE.from_pretrained takes it, or a local folder or Hub id "
                         "without sae_id=.")
    entry = releases[release]
    saes = {sae["id"]: sae for sae in entry.get("saes", [])}
    if sae_id not in saes:
        raise ResidError(f"{sae_id!r} is not a sae_id of the SAELens release {release!r} in {source}"
                         f"{_close(sae_id, saes)} (it has {len(saes)}).")
    sae, conversion = saes[sae_id], entry.get("conversion_func")
    fmt = FORMATS.get(conversion, f"sae-lens:{conversion}")
    return Resolved(release=release, sae_id=sae_id, repo_id=entry["repo_id"], path=sae["path"], format=fmt,
                    hook=_gemma_scope_1_hook(entry["repo_id"], sae["path"]) if conversion == "gemma_2" else None,
                    norm_scaling_factor=sae.get("norm_scaling_factor"), registry=source)


def registry() -> tuple[dict, str]:
    """SAELens's releases ({release: pretrained_saes.yaml's entry}) and where they were read."""
    spec = importlib.util.find_spec("sae_lens")  # finds the package without importing it
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            if (Path(folder) / "pretrained_saes.yaml").is_file():
                return _read_yaml(Path(folder) / "pretrained_saes.yaml"), str(Path(folder) / "pretrained_saes.yaml")
    return _read_table(), f"resid's table of the main releases ({TABLE.name}; install sae-lens for all of them)"


@functools.cache
def _read_yaml(path: Path) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader reads SAELens's 15,000 lines in 0.2 s
    try:
        found = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 (a safe loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ResidError(f"{path}: sae-lens's registry could not be read ({type(err).__name__}); reinstall "
                         "sae-lens, or uninstall it to use resid's own table of the main releases.") from None
    return _checked(found, str(path))


@functools.cache
def _read_table() -> dict:
    return _checked(json.loads(TABLE.read_text(encoding="utf-8"))["releases"], str(TABLE))


def _checked(releases: object, where: str) -> dict:
    """Only the fields read here, each of its type (a registry is data from elsewhere)."""
    def bad(what: str) -> ResidError:
        return ResidError(f"{where}: {what}; it is not a SAELens registry resid understands (reinstall sae-lens, or "
                          "uninstall it to use resid's own table of the main releases).")

    if not isinstance(releases, dict):
        raise bad("the file is not a mapping of release names")
    for name, entry in releases.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("repo_id"), str):
            raise bad(f"release {name!r} has no repo_id")
        for sae in entry.get("saes") or []:
            factor = sae.get("norm_scaling_factor") if isinstance(sae, dict) else None
            if not (isinstance(sae, dict) and isinstance(sae.get("id"), str) and isinstance(sae.get("path"), str)
                    and (factor is None or (isinstance(factor, float | int) and not isinstance(factor, bool)))):
                raise bad(f"release {name!r} lists an SAE without a string id and path (or with a "
                          "norm_scaling_factor that is not a number)")
    return releases


def _gemma_scope_1_hook(repo_id: str, path: str) -> str:
    """The hook SAELens's Gemma Scope 1 loader (get_gemma_2_config_from_hf) gives these folders, whose params.npz
    names none: the layer from the folder, the kind of site from the repo's name."""
    layer = re.search(r"layer_(\d+)", path)
    kind = re.search(r"-(res|mlp|att)(?:-|$)", repo_id)
    if "embedding" in path and kind and kind.group(1) == "res":
        return Site(None, "embed").hook_name
    if layer is None or kind is None:
        raise ResidError(f"The Gemma Scope folder {repo_id}/{path} names no layer_N or no res / mlp / att site; "
                         "load it by its Hub id with hook= naming the hook it reads.")
    return GEMMA_SCOPE_SITES[kind.group(1)](int(layer.group(1))).hook_name


def _close(name: str, known) -> str:
    close = difflib.get_close_matches(name, list(known), n=5, cutoff=0.5)
    return f"; the closest: {', '.join(close)}" if close else ""
