"""Loading a local Hugging Face folder: config.json + model.safetensors (or a sharded index) + tokenizer.json.

Tensors are read with safetensors (never pickle), memory-mapped, and mapped through the family's key table into a
Transformer built on the meta device: a tensor stored in the model's dtype and layout is used in place (its file's
pages are the weights; resid.load.weights), any other is copied. So loading takes about the weights' memory, never
a float32 detour. The BOS policy comes from tokenizer_config.json's add_bos_token when present,
else from the family's default (what Hugging Face's tokenizer does for it).
"""

import json
import math
from pathlib import Path

import tokenizers
import torch
from safetensors import SafetensorError, safe_open

from resid.errors import ResidError
from resid.load.families import Family
from resid.load.families.model_types import family_for
from resid.load.weights import assign, check_fits, check_size
from resid.model import Transformer
from resid.seq2seq import EncoderDecoder
from resid.tokenizer import Tokenizer


def load_hf_folder(
    folder: Path, name: str, device: torch.device | str | None, dtype: torch.dtype
) -> Transformer | EncoderDecoder:
    """A Transformer, or for encoder-decoder families (Marian) a resid.EncoderDecoder."""
    hf = _read_json(folder / "config.json", "config.json")
    family = family_for(hf.get("model_type"), folder)
    config = family.read(hf, f"{folder}/config.json")
    configs = (config,) if family.encoder is None else (family.encoder(hf), config)
    files = _weight_files(folder)
    stored = _stored(files)  # from the headers: nothing mapped yet (a mapping past ulimit -v is a MemoryError)
    values = sum(stored.values())
    check_size(configs, values, f"the model in {folder}")  # before anything of the config's size exists
    copied = sum(n for kind, n in stored.items() if DTYPES.get(kind) != dtype) * dtype.itemsize
    check_fits(values, dtype, torch.device(device or "cpu"), f"the model in {folder}",
               address_space=sum(path.stat().st_size for path in files) + copied)
    tensors = _SafetensorsIndex(files)
    with torch.device("meta"):  # no memory until the weights arrive (resid.load.weights.assign)
        if family.encoder is not None:
            start = hf.get("decoder_start_token_id", hf.get("pad_token_id"))
            model = EncoderDecoder(Transformer(configs[0]), Transformer(config), decoder_start_token_id=start)
            table = family.seq2seq_keys(configs[0], config, hf)
        else:
            model = Transformer(config)
            table = family.keys(config) if family.hf_keys is None else family.hf_keys(config, hf)
    model = model.to(dtype)  # before the weights: a tensor already in this dtype is used as it lies in the file
    ignore = family.ignore + (tuple(k.replace(".", r"\.") for k in family.head_keys) if config.tie_embeddings else ())
    canonical = {_canonical(n, family): n for n in tensors.names}  # table name -> name in the file
    assign(
        model,
        table,
        get=lambda key: tensors.get(canonical[key]) if key in canonical else None,
        available=canonical,
        ignore=ignore,
        where=f"the checkpoint in {folder}",
        share=True,
    )
    tokenizer = _tokenizer(folder, hf, family)
    for part in (model.encoder, model.decoder) if isinstance(model, EncoderDecoder) else (model,):
        part.tokenizer, part.name, part.weight_files = tokenizer, name, tuple(files)
    model.name, model.weight_files = name, tuple(files)
    return model.to(device=device or "cpu").eval()  # in `dtype` since the build


def _canonical(name: str, family: Family) -> str:
    """Base-model checkpoints (GPT2Model, LlamaModel) omit the backbone prefix; put it back."""
    if name.startswith(family.prefix) or name in family.head_keys:
        return name
    return family.prefix + name


def _read_json(path: Path, what: str) -> dict:
    """A JSON object from a file of the model folder; anything else (a folder, a list, bad bytes) is an error
    naming the file."""
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResidError(f"{path.parent} has no {what}: a model folder needs config.json and *.safetensors.") from None
    except IsADirectoryError:
        raise ResidError(f"{path} is a folder, not a file; {what} must be the JSON file the model was saved with. "
                         "Re-download or re-export the model.") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ResidError(f"{path} is not valid JSON ({err}); re-download or re-export it.") from None
    except OSError as err:
        raise ResidError(f"{path} could not be read ({err.strerror or err}); check its permissions.") from None
    if not isinstance(found, dict):
        raise ResidError(f"{path} holds a JSON {type(found).__name__}, not the JSON object {what} is; re-download "
                         "or re-export it.")
    return found


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index, index.name).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
            raise ResidError(f"{index} has no \"weight_map\" object of tensor name -> shard file name; "
                             "re-download it with the shards it lists.")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (folder / s).exists()]
        if not shards or missing:
            raise ResidError(f"{index} lists shard(s) {missing or shards} that are not in {folder}; download them all.")
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if found:
        return found
    pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
    hint = f" It has {pickled}: resid never loads pickled weights; convert them to safetensors." if pickled else ""
    raise ResidError(f"{folder} has no model.safetensors (or sharded index).{hint}")


# What a weight may be stored as: a floating-point type (cast to the model's dtype on load). An integer or bool
# tensor where a weight belongs is a damaged or relabelled file: its bit patterns would be read as numbers.
FLOATS = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
HEADER_MOST = 100 * 2**20  # safetensors' own bound on a header


def _stored(files: list[Path]) -> dict[str, int]:
    """Values the files hold per stored dtype, read from their headers (8 bytes of length, then JSON) without
    mapping them."""
    found: dict[str, int] = {}
    for path in files:
        try:
            with open(path, "rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                if length > HEADER_MOST:
                    raise ValueError(f"a header of {length:,} bytes")
                header = json.loads(handle.read(length))
            for name, entry in header.items():
                if name != "__metadata__":
                    found[entry["dtype"]] = found.get(entry["dtype"], 0) + math.prod(entry["shape"])
        except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ResidError(f"{path} is not a readable safetensors file ({err}); re-download it.") from None
    return found


class _SafetensorsIndex:
    """Lazy access to tensors spread over one or more safetensors files."""

    def __init__(self, files: list[Path]):
        self._where: dict[str, Path] = {}
        self._handles = {}
        for path in files:
            try:
                handle = safe_open(str(path), framework="pt")
            except (SafetensorError, OSError) as err:
                raise ResidError(f"{path} is not a readable safetensors file ({err}); re-download it.") from None
            self._handles[path] = handle
            for key in handle.keys():
                self._where[key] = path

    @property
    def names(self) -> list[str]:
        return list(self._where)

    def get(self, name: str) -> torch.Tensor:
        path = self._where[name]
        dtype = self._handles[path].get_slice(name).get_dtype()
        if dtype not in FLOATS:
            raise ResidError(
                f"Tensor {name!r} in {path} has dtype {dtype}, not a floating-point type ({', '.join(FLOATS)}): its "
                "values would be integer bit patterns read as numbers. The file is damaged or its header was "
                "edited; re-export or re-download it."
            )
        try:
            return self._handles[path].get_tensor(name)
        except (SafetensorError, OSError) as err:
            raise ResidError(f"Could not read tensor {name!r} from {path} ({err}); "
                             "the file may be truncated.") from None


def _tokenizer(folder: Path, hf: dict, family: Family) -> Tokenizer | None:
    path = folder / "tokenizer.json"
    if not path.exists():
        return None
    try:
        raw = tokenizers.Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises bare Exceptions for malformed files
        raise ResidError(f"{path} could not be read as a tokenizers file ({err}); re-download it.") from None
    tok_config = {}
    if (folder / "tokenizer_config.json").exists():
        tok_config = _read_json(folder / "tokenizer_config.json", "tokenizer_config.json")

    def token_id(field: str, config_field: str, default: str | None = None) -> int | None:
        token = tok_config.get(field, default)
        if isinstance(token, dict):
            token = token.get("content")
        found = raw.token_to_id(token) if isinstance(token, str) else None
        value = hf.get(config_field)
        if isinstance(value, list):  # several (GLM-4's and Llama 3.1's eos_token_id): the first is the token's own
            value = value[0] if value else None
        return found if found is not None else value

    prepend_bos = tok_config.get("add_bos_token", family.prepend_bos)
    # Template tokenizers (BERT) open every text with [CLS], their "BOS"
    bos = token_id("cls_token", "cls_token_id", "[CLS]") if family.template else token_id("bos_token", "bos_token_id")
    return Tokenizer(
        raw,
        bos_token_id=bos,
        prepend_bos=bool(prepend_bos) and bos is not None,
        pad_token_id=token_id("pad_token", "pad_token_id"),
        eos_token_id=(token_id("sep_token", "sep_token_id", "[SEP]") if family.template
                      else token_id("eos_token", "eos_token_id")),
        template=family.template,
        mask_token_id=token_id("mask_token", "mask_token_id", "[MASK]" if family.template else None),
    )
