"""resid.dictionaries.load(path_or_hub_id, model=None), or load(release, sae_id=..., model=None) with SAELens's
names: detect a dictionary folder's format, read it, and check it
against the model it will be applied to.

Formats, told apart by the files a folder holds:

    cfg.json + sae_weights.safetensors      SAELens                    -> Dictionary
    cfg.json + sae.safetensors              sparsify                   -> Dictionary
    hookpoint folders each holding those    sparsify (a whole run)     -> list[Dictionary]
    config.json + params.safetensors        Gemma Scope 2              -> Dictionary
    params.npz                              Gemma Scope 1              -> Dictionary
    config.yaml                             circuit-tracer             -> list[Dictionary] (one per layer) or a
                                                                          CrossLayerTranscoder
    subfolders each holding a dictionary    a folder of dictionaries   -> list[Dictionary], the subfolders' in
                                            (what `resid train-sae` /     natural order ("layer_2" before
                                            `resid train-transcoder`      "layer_10"), each list flattened
                                            write: one SAELens folder
                                            per dictionary)

A Hugging Face Hub id ("owner/repo" or "owner/repo/sub/folder") is downloaded into the Hub cache and read the same
way (it needs the network once; offline, a clear error). A SAELens release name with `sae_id=` (what SAELens's
SAE.from_pretrained(release, sae_id) takes) is resolved to its Hub repo and folder by resid.dictionaries.releases,
then downloaded and read the same way.
"""

import dataclasses
import re
from pathlib import Path

from resid.dictionaries import hub, releases
from resid.dictionaries.check import check
from resid.dictionaries.crosslayer import CrossLayerTranscoder
from resid.dictionaries.dictionary import Dictionary
from resid.dictionaries.formats import circuit_tracer, gemma_scope, saelens, sparsify
from resid.dictionaries.hooks import hook_point
from resid.errors import ResidError
from resid.load.hub import FOLDER_ID

Loaded = Dictionary | list[Dictionary] | CrossLayerTranscoder


def detect(folder: Path) -> str:
    """The format of a local dictionary folder (see the module docstring); "folders" for a folder of dictionary
    folders."""
    found = _format(folder)
    if found is not None:
        return found
    subfolders = _subfolders(folder)
    formats = {sub.name: _format(sub) for sub in subfolders}
    if subfolders and all(formats.values()):
        return "folders"
    if any(formats.values()):
        strays = [name for name, fmt in formats.items() if fmt is None]
        raise ResidError(f"{folder} holds dictionary folders ({', '.join(n for n, f in formats.items() if f)}) and "
                         f"subfolders that are not dictionaries ({', '.join(strays)}): load the dictionary folders "
                         "one by one, or move the others out, so that nothing in it is skipped silently.")
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".pt", ".pth", ".bin", ".pkl"))
    hint = f" It holds {pickled}: resid never unpickles weights; convert them to safetensors." if pickled else ""
    raise ResidError(f"{folder} is not a dictionary folder resid reads: it needs cfg.json + sae_weights.safetensors "
                     "(SAELens), cfg.json + sae.safetensors (sparsify), params.safetensors + config.json (Gemma Scope "
                     f"2), params.npz (Gemma Scope 1) or config.yaml (circuit-tracer), or subfolders that each hold "
                     f"one.{hint}")


def _subfolders(folder: Path) -> list[Path]:
    """The visible subfolders, in natural order ("layer_2" before "layer_10")."""
    natural = lambda path: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)]  # noqa: E731
    return sorted((sub for sub in folder.iterdir() if sub.is_dir() and not sub.name.startswith(".")), key=natural)


def _format(folder: Path) -> str | None:
    has = lambda name: (folder / name).exists()  # noqa: E731
    if has("cfg.json") and has("sae_weights.safetensors"):
        return "saelens"
    if has("cfg.json") and has("sae.safetensors"):
        return "sparsify"
    if has("params.safetensors") or has("params.npz"):
        return "gemma_scope"
    if has("config.yaml"):
        return "circuit_tracer"
    if any(sub.is_dir() and (sub / "sae.safetensors").exists() for sub in folder.iterdir()):
        return "sparsify"
    return None


def load(path: str | Path, model=None, *, sae_id: str | None = None, hook: str | None = None,
         hook_out: str | None = None, norm_scaling_factor: float | None = None) -> Loaded:
    """Read the dictionary (or set of dictionaries) at `path`, a local folder or a Hub id, and when `model` (a
    resid.Transformer) is given, check it against the model (resid.dictionaries.check), record the sites its
    hooks read and put it on the model's device. `hook` / `hook_out` name the hooks of a file that does not say
    them (Gemma Scope 1); `norm_scaling_factor` is SAELens's registry factor for "expected_average_only_in"
    dictionaries.

    A folder of dictionary folders (what `resid train-sae` and `resid train-transcoder` write into --out) gives a
    list: every subfolder's dictionaries, in natural order; a cross-layer transcoder is loaded from its own
    folder.

    With `sae_id`, `path` is a SAELens release name and the dictionary is the one SAELens's
    SAE.from_pretrained(path, sae_id) loads: load("gemma-scope-2b-pt-res-canonical",
    sae_id="layer_12/width_16k/canonical", model=model). The release's hook and norm_scaling_factor come from
    SAELens's registry (resid.dictionaries.releases)."""
    if isinstance(model, str):
        raise ResidError(f"resid.dictionaries.load's second argument is the model; {model!r} is a string. For a "
                         f"SAELens release pass the SAE's id by name: resid.dictionaries.load({str(path)!r}, "
                         f"sae_id={model!r}, model=model).")
    if sae_id is not None and not isinstance(sae_id, str):
        raise ResidError(f"sae_id={sae_id!r} is not a string ({type(sae_id).__name__}): a SAELens sae_id is a string "
                         "such as 'layer_12/width_16k/canonical' or 'blocks.8.hook_resid_pre'; pass it as the "
                         "release's registry names it.")
    if sae_id is not None:
        folder, hook, norm_scaling_factor = _release(str(path), sae_id, hook, norm_scaling_factor)
    else:
        folder = _local(path)
    fmt = detect(folder)
    if fmt == "folders":
        return _load_many(folder, model, hook, hook_out, norm_scaling_factor)
    if fmt == "saelens":
        found = saelens.read(folder, norm_scaling_factor=norm_scaling_factor)
    else:
        if norm_scaling_factor is not None:
            raise ResidError(f"norm_scaling_factor is a SAELens setting; {folder} is a {fmt} dictionary.")
        found = {"sparsify": sparsify.read, "gemma_scope": gemma_scope.read, "circuit_tracer": circuit_tracer.read}[
            fmt](folder)
    dictionaries = found if isinstance(found, list) else [found]
    if hook is not None or hook_out is not None:
        if len(dictionaries) != 1 or isinstance(found, CrossLayerTranscoder):
            raise ResidError(f"hook= names the hook of one dictionary; {folder} holds several (their files name "
                             "their hooks).")
        dictionaries = [_override_hooks(dictionaries[0], hook, hook_out)]
    if model is not None:
        dictionaries = [check(dictionary, model).to(model.device) for dictionary in dictionaries]
    else:
        dictionaries = [_map_without_model(d) if isinstance(d, Dictionary) else d for d in dictionaries]
    return dictionaries if isinstance(found, list) else dictionaries[0]


def _release(release: str, sae_id: str, hook: str | None,
             norm_scaling_factor: float | None) -> tuple[Path, str | None, float | None]:
    """The Hub folder of `sae_id` in SAELens's `release`, with the hook and norm_scaling_factor its registry gives
    (those passed win)."""
    found = releases.resolve(release, sae_id)
    if found.format not in releases.READABLE:
        raise ResidError(f"{release} / {sae_id} is {found.path!r} in the Hub repo {found.repo_id}, a {found.format} "
                         f"folder, which SAELens converts with its own loader and resid does not read (it reads "
                         f"{', '.join(releases.READABLE)} releases); convert it with SAELens (SAE.from_pretrained, "
                         "then save_model) and load that folder.")
    folder = hub.folder(found.repo_id, found.path)
    return folder, hook or found.hook, norm_scaling_factor if norm_scaling_factor is not None else \
        found.norm_scaling_factor


def _load_many(folder: Path, model, hook: str | None, hook_out: str | None,
               norm_scaling_factor: float | None) -> list[Dictionary]:
    if hook is not None or hook_out is not None or norm_scaling_factor is not None:
        raise ResidError(f"{folder} is a folder of dictionaries; hook=, hook_out= and norm_scaling_factor= are "
                         "settings of one dictionary: load that dictionary's folder with them.")
    found = []
    for sub in _subfolders(folder):
        loaded = load(sub, model)
        if isinstance(loaded, CrossLayerTranscoder):
            raise ResidError(f"{sub} is a cross-layer transcoder inside the folder of dictionaries {folder}; load it "
                             "from its own folder (it replaces every MLP at once, so it is not one of a list).")
        found += loaded if isinstance(loaded, list) else [loaded]
    return found


def _override_hooks(dictionary: Dictionary, hook: str | None, hook_out: str | None) -> Dictionary:
    said = [name for name, value in (("hook", dictionary.hook_in), ("hook_out", dictionary.hook_out))
            if value is not None and (hook if name == "hook" else hook_out) not in (None, value)]
    if said:
        raise ResidError(f"Dictionary {dictionary.name!r} already names its hooks ({dictionary.hook_in!r} -> "
                         f"{dictionary.hook_out!r}); {said[0]}= may only fill in a hook the file does not say.")
    transcoder = dictionary.is_transcoder or (hook_out is not None and hook_out != (hook or dictionary.hook_in))
    hook_in = hook or dictionary.hook_in
    return dictionary.bound(dataclasses.replace(dictionary.binding, hook_in=hook_in,
                                                hook_out=hook_out or dictionary.hook_out or hook_in,
                                                transcoder=transcoder))


def _map_without_model(dictionary: Dictionary) -> Dictionary:
    """The dictionary with the sites of hooks that map without a model's config; left None otherwise (load with a
    model to map and check every hook)."""
    head = dictionary.metadata.get("hook_head_index")
    points = {}
    for attribute, hook in (("point_in", dictionary.hook_in), ("point_out", dictionary.hook_out)):
        try:
            points[attribute] = hook_point(hook, None, head) if hook is not None else None
        except ResidError:
            points[attribute] = None
    return dictionary.bound(dataclasses.replace(dictionary.binding, **points))


def _local(path: str | Path) -> Path:
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    if folder.exists():
        raise ResidError(f"{folder} is a file; resid.dictionaries.load takes the folder that holds a dictionary.")
    name = str(path)
    if isinstance(path, Path) or name.startswith((".", "~", "/")) or not FOLDER_ID.fullmatch(name):
        raise ResidError(f"No dictionary folder at {folder}: pass a local folder or a Hugging Face Hub id "
                         "('owner/repo' or 'owner/repo/sub/folder').")
    owner, repo, *sub = name.split("/")
    return hub.folder(f"{owner}/{repo}", "/".join(sub) or None)
