"""EleutherAI sparsify: `cfg.json` + `sae.safetensors` in a folder named after its hookpoint (a module of the
Hugging Face base model, e.g. `layers.5` or `layers.5.mlp`); a parent folder holds one such folder per hookpoint.

An SAE reads the module's output; a transcoder (`transcode: true`) reads its input and predicts its output. resid
writes these hooks as `<hookpoint>.output` / `<hookpoint>.input` (Gemma Scope's spelling, resid.dictionaries.hooks).

Tensors (the encoder is an nn.Linear, so its weight is transposed):

    encoder.weight [d_sae d_in]  -> W_enc = encoder.weight.T     encoder.bias [d_sae] -> b_enc
    W_dec [d_sae d_in]           b_dec [d_in]                    (a transcoder's output is d_in wide too)
    W_skip [d_in d_in]           (skip_connection: + x @ W_skip.T; resid stores W_skip.T)

Encoding: an SAE subtracts b_dec from its input (a transcoder does not), then top-k of relu(x @ W_enc + b_enc).
cfg.json fields: activation ("topk"; "groupmax" is refused), k, num_latents, expansion_factor, transcode,
skip_connection, d_in, and the training-only normalize_decoder and multi_topk.
"""

from pathlib import Path

from resid.dictionaries.dictionary import ActivationFunction, Binding, Dictionary, InputNormalization, Weights
from resid.dictionaries.formats import (
    as_bool,
    as_choice,
    as_int,
    check_dictionary_fields,
    read_json,
    read_safetensors,
    take,
)
from resid.errors import ResidError

CONFIG, WEIGHTS = "cfg.json", "sae.safetensors"
READ = frozenset({"activation", "k", "num_latents", "expansion_factor", "transcode", "skip_connection", "d_in"})
TRAINING = frozenset({"normalize_decoder", "multi_topk"})  # training-time only: encoding ignores them


def read(folder: Path) -> Dictionary | list[Dictionary]:
    """One sparsify dictionary, or one per hookpoint folder of a sparsify run (sorted by layer)."""
    if (folder / CONFIG).exists():
        return _read_one(folder)
    inside = [sub for sub in folder.iterdir() if sub.is_dir() and (sub / WEIGHTS).exists()]
    if not inside:
        raise ResidError(f"{folder} has no {CONFIG} + {WEIGHTS}, nor hookpoint folders holding them (sparsify).")
    return [_read_one(sub) for sub in sorted(inside, key=_natural)]


def _natural(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in path.name.split(".")]


def _read_one(folder: Path) -> Dictionary:
    where = str(folder / CONFIG)
    cfg = read_json(folder / CONFIG)
    check_dictionary_fields(cfg, READ | TRAINING, where, "a sparsify dictionary")
    if cfg.get("activation", "topk") == "groupmax":
        raise ResidError(f"{where}: activation 'groupmax'; resid computes sparsify's 'topk' ('groupmax' is not "
                         "supported yet).")
    as_choice(cfg.get("activation", "topk"), ("topk",), "activation", where)
    d_in = as_int(cfg.get("d_in"), "d_in", where)
    k = as_int(cfg.get("k", 32), "k", where)
    transcode = as_bool(cfg.get("transcode", False), "transcode", where)
    skip = as_bool(cfg.get("skip_connection", False), "skip_connection", where)
    for name in TRAINING & set(cfg):
        as_bool(cfg[name], name, where)
    latents = {name: as_int(cfg[name], name, where) for name in ("num_latents", "expansion_factor")
               if cfg.get(name) not in (None, 0)}  # sparsify writes num_latents 0 for "from expansion_factor"
    known = {"encoder.weight": True, "encoder.bias": True, "W_dec": True, "b_dec": True, "W_skip": skip}
    found = take(read_safetensors(folder / WEIGHTS), known, str(folder / WEIGHTS))
    d_sae = found["encoder.weight"].shape[0]
    expected = latents.get("num_latents") or d_in * latents.get("expansion_factor", 32)
    if found["encoder.weight"].shape != (d_sae, d_in) or d_sae != expected:
        raise ResidError(f"{folder / WEIGHTS}: encoder.weight has shape {list(found['encoder.weight'].shape)}; "
                         f"{CONFIG} says d_in={d_in} and {expected} latents.")
    hookpoint = folder.name  # sparsify names each dictionary's folder after its hookpoint
    return Dictionary(
        Weights(found["encoder.weight"].T.contiguous(), found["W_dec"], found["b_dec"], found["encoder.bias"],
                found["W_skip"].T.contiguous() if skip else None),
        ActivationFunction("topk", k=k), normalization=InputNormalization(apply_b_dec_to_input=not transcode),
        binding=Binding(f"{hookpoint}.input" if transcode else f"{hookpoint}.output", f"{hookpoint}.output",
                        transcoder=transcode),
        name=hookpoint, format="sparsify", metadata={"hookpoint": hookpoint},
    )
