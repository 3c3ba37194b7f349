"""The Hugging Face Hub when there is no network: use the local cache, or say in one line how to fill it.

Without this, a Hub id on a machine with no network costs about 25 s of retries (huggingface_hub retries each file
five times with back-off) before diffusers gives up. One short probe of the Hub endpoint decides up front.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from urllib.parse import urlsplit

from huggingface_hub import constants, get_session, hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

from ..config import SDXL_BASE_FLAX_REVISION
from ..contract.errors import CheckpointError, ModelLoadError

logger = logging.getLogger(__name__)

#: Seconds to wait for the Hub endpoint to answer before treating it as unreachable.
PROBE_TIMEOUT_S = 5.0
#: What the loader reads: configs, tokenizers, and the weights of either format (Flax preferred when both exist).
CHECKPOINT_PATTERNS = ("model_index.json", "*/*.json", "*/*.txt", "*/*.msgpack", "*/*.safetensors")
#: SDXL base's Flax revision (refs/pr/95) also holds PyTorch weights: take only the Flax ones from it.
FLAX_ONLY_PATTERNS = ("model_index.json", "*/*.json", "*/*.txt", "*/*.msgpack")


def download_command(repo_id: str, revision: str | None) -> str:
    """The shell command that puts what the loader needs into the Hugging Face cache (HF_HOME)."""
    words = ["hf", "download", repo_id]
    if revision:
        words += ["--revision", revision]
    words += ["--include", *(FLAX_ONLY_PATTERNS if revision == SDXL_BASE_FLAX_REVISION else CHECKPOINT_PATTERNS)]
    return shlex.join(words)


def hub_reachable(endpoint: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """One HEAD request to the Hub endpoint (HF_ENDPOINT, proxies honoured); any HTTP answer means reachable."""
    endpoint = endpoint or constants.ENDPOINT
    try:
        get_session().head(endpoint, timeout=timeout)  # an httpx client: redirects not followed
    except Exception as exc:  # DNS failure, refused, timeout, proxy error: all mean "no Hub from here"
        logger.info("Hugging Face Hub at %s unreachable: %s", urlsplit(endpoint).netloc, exc.__class__.__name__)
        return False
    return True


def source_when_offline(
    repo_id: str, revision: str | None, *, endpoint: str | None = None, cache_dir: str | None = None
) -> str:
    """`repo_id` when the Hub answers; else its cached snapshot directory; else ModelLoadError with the command.

    With HF_HUB_OFFLINE set the user chose offline mode: diffusers reads the cache itself, nothing is probed.
    """
    if constants.HF_HUB_OFFLINE or hub_reachable(endpoint):
        return repo_id
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        where = repo_id + (f" (revision {revision})" if revision else "")
        raise ModelLoadError(
            f"The Hugging Face Hub is unreachable (no network?) and {where} is not in the local cache; "
            f"where there is network run `{download_command(repo_id, revision)}` (it fills HF_HOME, "
            "default ~/.cache/huggingface), or pass a local directory or --model tiny."
        ) from None
    logger.info("Hub unreachable: loading %s from the local cache %s", repo_id, path)
    return path


def hub_file(repo_id: str, filename: str, *, endpoint: str | None = None, cache_dir: str | None = None) -> str:
    """One file of a Hub repository (`--unet REPO:FILE`): downloaded, or the cached copy when the Hub is unreachable
    (the same short probe as for --model); else ModelLoadError with the command that fetches it."""
    offline = constants.HF_HUB_OFFLINE or not hub_reachable(endpoint)
    command = shlex.join(["hf", "download", repo_id, filename])
    try:
        return hf_hub_download(repo_id, filename, cache_dir=cache_dir, local_files_only=offline)
    except (RepositoryNotFoundError, GatedRepoError):
        raise ModelLoadError(
            f"Hub repository {repo_id} was not found (or needs a token: set HF_TOKEN); check the REPO part of --unet."
        ) from None
    except EntryNotFoundError:
        if offline:  # local_files_only raises a subclass of EntryNotFoundError when the file is not cached
            raise ModelLoadError(_offline_file_message(repo_id, filename, command, constants.HF_HUB_OFFLINE)) from None
        raise ModelLoadError(f"Hub repository {repo_id} has no file {filename}; check --unet's FILE part.") from None
    except Exception as exc:  # no network after all, a proxy error, a full disk: one line
        if offline or isinstance(exc, (ConnectionError, OSError)):
            raise ModelLoadError(_offline_file_message(repo_id, filename, command, constants.HF_HUB_OFFLINE)) from None
        detail = " ".join(str(exc).split())[:200] or exc.__class__.__name__
        raise ModelLoadError(f"Could not download {filename} from {repo_id}: {detail}") from None


def _offline_file_message(repo_id: str, filename: str, command: str, offline_mode: bool) -> str:
    why = "HF_HUB_OFFLINE is set" if offline_mode else "The Hugging Face Hub is unreachable (no network?)"
    return (
        f"{why} and {repo_id}:{filename} is not in the local cache; "
        f"where there is network run `{command}` (it fills HF_HOME, default ~/.cache/huggingface), "
        "or pass --unet a local .safetensors file."
    )


def folder_or_snapshot(source: str, patterns: tuple[str, ...], layout: str) -> Path:
    """A second network's source (--controlnet, --refiner): a folder as is; a Hub id through the local Hugging Face
    cache, downloaded (only `patterns`) when the Hub answers; else CheckpointError with the command that fetches it.
    `layout` names what the folder should hold, for the sentence a path that is neither gets."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise CheckpointError(f"it is no folder in diffusers' layout ({layout}) nor a Hub id")
    try:
        return Path(snapshot_download(source, allow_patterns=list(patterns), local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the cache: download it when the Hub can be reached
        if not hub_reachable():
            command = shlex.join(["hf", "download", source, "--include", *patterns])
            raise CheckpointError(
                f"it is not in the Hugging Face cache and the Hub cannot be reached (run: {command})"
            ) from None
        return Path(snapshot_download(source, allow_patterns=list(patterns)))
