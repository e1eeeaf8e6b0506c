"""Dictionaries on the Hugging Face Hub: a folder given by its Hub id, one file of a repo (circuit-tracer's hf://
transcoder paths), fetched into the Hub cache. huggingface_hub is imported only when something is fetched, so that
reading local folders never pays for it; offline, one clear error."""

from pathlib import Path

from resid.errors import ResidError


def folder(repo_id: str, subfolder: str | None) -> Path:
    """A Hub repo (or one folder of it) in the Hub cache: a dictionary given by its Hub id."""
    from huggingface_hub import snapshot_download  # noqa: PLC0415 (only for Hub ids)

    patterns = [f"{subfolder}/*"] if subfolder else None
    try:
        root = Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as err:  # offline, unknown repo, gated repo: huggingface_hub raises many types
        raise ResidError(f"Could not fetch the dictionary {repo_id!r}{f' ({subfolder})' if subfolder else ''} from the "
                         f"Hugging Face Hub ({type(err).__name__}: {_one_line(err)}). Offline, download the folder "
                         "elsewhere and pass its local path.") from None
    return root / subfolder if subfolder else root


def file(repo_id: str, filename: str, revision: str | None = None) -> Path:
    """One file of a Hub repo, in the Hub cache (circuit-tracer's hf:// transcoder paths)."""
    from huggingface_hub import hf_hub_download  # noqa: PLC0415

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision))
    except Exception as err:
        raise ResidError(f"Could not fetch {filename!r} of {repo_id!r} from the Hugging Face Hub ({type(err).__name__}:"
                         f" {_one_line(err)}). Offline, download it and list its local path in config.yaml.") from None


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
