"""Fetching a Hugging Face Hub id into the Hub cache (only what resid reads: configs, safetensors,
tokenizer files), then loading it as a local folder. Offline or unknown ids give one clear error.

What a Hub id is, once for models and dictionaries: `REPO_ID` a repository ("gpt2", "EleutherAI/pythia-70m");
`FOLDER_ID` a folder of an owner's repository ("owner/repo" or "owner/repo/sub/folder": resid.dictionaries.load).
"""

import re
from pathlib import Path

from resid.errors import ResidError

_NAME = r"[A-Za-z0-9][\w.\-]*"  # an owner or a repository name: no leading '.', '-' or '_'
REPO_ID = re.compile(rf"{_NAME}(?:/[\w.\-]+)?")
FOLDER_ID = re.compile(rf"{_NAME}/[\w.\-]+(?:/[\w.\-/]+)?")

WANTED = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]


def fetch(repo_id: str, unknown_message: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise ResidError("Loading a Hub id needs huggingface_hub: pip install huggingface_hub") from None
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=WANTED))
    except RepositoryNotFoundError:
        raise ResidError(unknown_message) from None
    except LocalEntryNotFoundError:
        raise ResidError(
            f"{unknown_message} The Hub could not be reached (offline, or HF_HUB_OFFLINE is set) and "
            f"{repo_id!r} is not in the local Hub cache: connect to the network once, or download the folder "
            "elsewhere and pass its path."
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise ResidError(f"Fetching {repo_id!r} from the Hugging Face Hub failed ({err}). {unknown_message}") from None
    if not (folder / "config.json").exists():
        raise ResidError(f"Hub repo {repo_id!r} has no config.json: it is not a transformers model resid can read.")
    return folder
