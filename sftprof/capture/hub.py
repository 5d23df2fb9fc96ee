"""Llama 2 7B and databricks-dolly-15k from the Hugging Face Hub: verified, resumable, token-safe.

The model (gated) comes through `snapshot_download` into a shared folder, `model.dir`/`model.repo`;
dolly through `hf_hub_download` into the HF cache (HF_HOME), then a copy per experiment. Both use
the real huggingface_hub client, so mirrors (HF_ENDPOINT or `endpoint`), HF_HOME, HF_HUB_OFFLINE
and the `hf auth login` token work as for every HF tool.

Verification: huggingface_hub checks a download's length, not its content, and hands back a
file already on disk without reading it. So every file is hashed here against the Hub's record
(sha256 for LFS files, the git blob sha1 for git-stored ones); a mismatch is fetched once more,
then is an error. Only a checkpoint whose every file passed gets its manifest, the file the
workflow waits for, so a partial download never passes as complete.

Resume: huggingface_hub 2.4 resumes a dropped connection within a run with a Range request, from
the last whole 10 MiB chunk it wrote. Across runs the files already complete are kept and an
unfinished file starts over (2.4 writes each download to a process-unique temporary file and
deletes it on failure, because flock is unreliable on cluster file systems).

Tokens: from `token_file`, else HF_TOKEN or the stored login token. The value goes to
huggingface_hub only, which sends it to the Hub and never to a CDN or a plain mirror URL; it is
never logged, put in an error message or written anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx2
import huggingface_hub
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import filter_repo_objects

from sftprof import layout
from sftprof.errors import SftprofError
from sftprof.io import atomic_path, atomic_write_text

SHA256 = re.compile(r"[0-9a-f]{64}")
GIT_SHA1 = re.compile(r"[0-9a-f]{40}")
# What a downloaded model's or dataset's content depends on. The other keys (endpoint,
# token_file, offline, sha256) only say how to get or check it: changing them reruns nothing.
MODEL_IDENTITY = ("repo", "revision", "allow_patterns")
DOLLY_IDENTITY = {"hub": ("repo", "revision", "filename"), "path": ("path",)}
_CHUNK = 8 * 2**20


class HubError(SftprofError, RuntimeError):
    """A download cannot go on; the message says why and what to do. It never holds a token."""


@dataclass(frozen=True)
class ExpectedFile:
    """One file as the Hub records it: LFS files by content sha256, git-stored ones by blob sha1."""

    path: str
    size: int | None
    sha256: str | None = None
    git_sha1: str | None = None


@dataclass(frozen=True)
class Listing:
    """The files of a repo at a commit that match the allow patterns, as the Hub lists them."""

    repo: str
    revision: str
    allow_patterns: list[str]
    commit: str
    files: list[ExpectedFile]

    @classmethod
    def from_json(cls, data: dict) -> Listing:
        return cls(**{**data, "files": [ExpectedFile(**f) for f in data["files"]]})


def resolve_token(token_file: str | None) -> str | None:
    """The token in `token_file`, else HF_TOKEN or the `hf auth login` token, else None."""
    if not token_file:
        return huggingface_hub.get_token()
    path = Path(token_file).expanduser()
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise HubError(f"token file {path} does not exist") from None
    except OSError as error:
        raise HubError(f"token file {path} cannot be read: {error.strerror}") from None
    if not token:
        raise HubError(f"token file {path} is empty")
    if path.stat().st_mode & 0o077:
        logging.warning("token file %s can be read by other users: chmod 600 it", path)
    return token


def is_offline(settings: dict) -> bool:
    return settings["offline"] or huggingface_hub.is_offline_mode()


def hub_endpoint(settings: dict) -> str:
    return (settings.get("endpoint") or hf_constants.ENDPOINT).rstrip("/")


def _repo_page(endpoint: str, repo: str, repo_type: str) -> str:
    return f"{endpoint}/datasets/{repo}" if repo_type == "dataset" else f"{endpoint}/{repo}"


@contextmanager
def hub_errors(section: str, settings: dict, token: str | None, repo_type: str = "model") -> Iterator[None]:
    """huggingface_hub's and httpx's errors as HubErrors that say what to do (`section` is
    `model` or `data`, the config section to fix)."""
    repo, revision, endpoint = settings["repo"], settings["revision"], hub_endpoint(settings)
    page = _repo_page(endpoint, repo, repo_type)
    what = f"{repo} (revision {revision}) from {endpoint}"
    try:
        yield
    except RevisionNotFoundError:
        raise HubError(
            f"{what}: there is no revision {revision!r} in {repo}; set {section}.revision to one of "
            f"its branches, tags or commits (see {page}/commits/main)"
        ) from None
    except GatedRepoError:
        if token is None:
            raise HubError(
                f"{what}: {repo} is gated and no token was given. Set HF_TOKEN, or {section}.token_file "
                "to a file that holds the token, of an account that accepted the license at "
                f"{page}"
            ) from None
        raise HubError(
            f"{what}: {repo} is gated and the token has no access to it. Accept the license at {page} "
            "with the account the token belongs to (approval can take a while), or use that "
            "account's token"
        ) from None
    except RepositoryNotFoundError:
        who = "no token was given" if token is None else "the token cannot see it"
        raise HubError(
            f"{what}: no repository {repo} there (or it is private and {who}); check {section}.repo"
        ) from None
    except HfHubHTTPError as error:
        status = error.response.status_code
        if status == 401:
            raise HubError(
                f"{what}: the Hub rejected the token (HTTP 401); it may be mistyped, revoked or "
                f"expired: make a new one and put it in HF_TOKEN or {section}.token_file"
            ) from None
        if status == 403:
            raise HubError(
                f"{what}: the token may not read {repo} (HTTP 403); a fine-grained token needs "
                "read access to public gated repositories"
            ) from None
        raise HubError(f"{what}: the Hub answered HTTP {status}: {error.server_message or 'no details'}") from None
    except (
        httpx2.ConnectError,
        httpx2.TimeoutException,
        httpx2.RemoteProtocolError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
    ) as error:
        raise HubError(
            f"{what}: cannot reach {endpoint} ({type(error).__name__}). Where there is no internet "
            f"(compute nodes), download on the login node first and set {section}.offline: true (or "
            f"HF_HUB_OFFLINE=1) to use the files already there, or give {section}.source: path"
        ) from None


def _digests(path: Path, git_blob: bool) -> tuple[str, str | None]:
    """The file's sha256, and (if asked) its git blob sha1, in one read."""
    sha256 = hashlib.sha256()
    sha1 = None
    if git_blob:
        sha1 = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            sha256.update(chunk)
            if sha1 is not None:
                sha1.update(chunk)
    return sha256.hexdigest(), None if sha1 is None else sha1.hexdigest()


def _problem(expected: ExpectedFile, path: Path) -> tuple[str | None, str | None]:
    """(what is wrong with the file at `path`, or None; its sha256 when it was read)."""
    if not path.is_file():
        return "missing", None
    size = path.stat().st_size
    if expected.size is not None and size != expected.size:
        return f"{size} bytes, the Hub says {expected.size}", None
    sha256, git_sha1 = _digests(path, git_blob=expected.sha256 is None)
    if expected.sha256 is not None and sha256 != expected.sha256:
        return f"sha256 {sha256}, the Hub says {expected.sha256}", sha256
    if expected.git_sha1 is not None and git_sha1 != expected.git_sha1:
        return f"git blob sha1 {git_sha1}, the Hub says {expected.git_sha1}", sha256
    return None, sha256


def _expected_from_tree(entry) -> ExpectedFile:
    if entry.lfs is not None:
        return ExpectedFile(entry.path, entry.lfs.size, sha256=entry.lfs.sha256)
    return ExpectedFile(entry.path, entry.size, git_sha1=entry.blob_id)


def _size(size: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size:.0f} bytes"


# --- the model -------------------------------------------------------------------------------


def checkpoint_dir(model: dict) -> str:
    """Where a hub model is kept: `dir`/`repo`, e.g. /shared/models/meta-llama/Llama-2-7b-hf."""
    return os.path.normpath(os.path.join(model["dir"], model["repo"]))


def hub_model_settings(config: dict, checkpoint: str) -> dict:
    """The model section of the first experiment that downloads into `checkpoint` (the config
    checks ensure that every such experiment asks for the same files)."""
    for exp in config["experiments"].values():
        model = exp["model"]
        if model["source"] == "hub" and checkpoint_dir(model) == os.path.normpath(checkpoint):
            return model
    raise HubError(f"no experiment downloads a hub model into {checkpoint}")


def model_identity(model: dict) -> dict:
    return {key: model[key] for key in MODEL_IDENTITY}


def _hub_listing(model: dict, token: str | None) -> Listing:
    api = huggingface_hub.HfApi(endpoint=hub_endpoint(model), token=token or False)
    commit = api.repo_info(model["repo"], revision=model["revision"]).sha
    tree = {
        entry.path: entry
        for entry in api.list_repo_tree(model["repo"], recursive=True, revision=commit)
        if isinstance(entry, huggingface_hub.hf_api.RepoFile)
    }
    wanted = sorted(filter_repo_objects(tree, allow_patterns=model["allow_patterns"]))
    if not wanted:
        raise HubError(
            f"{model['repo']} (revision {model['revision']}) has no file that matches model.allow_patterns "
            f"{model['allow_patterns']}; it has: {', '.join(sorted(tree)) or 'no files'}"
        )
    return Listing(
        model["repo"],
        model["revision"],
        list(model["allow_patterns"]),
        commit,
        [_expected_from_tree(tree[path]) for path in wanted],
    )


def _recorded_listing(checkpoint: Path, model: dict) -> Listing:
    """The Hub's listing saved by an earlier online run, for checking files offline."""
    record = checkpoint / layout.HUB_LISTING
    if not record.is_file():
        raise HubError(
            f"offline (model.offline or HF_HUB_OFFLINE), and {checkpoint} holds no download of "
            f"{model['repo']}: download it once where there is internet (the login node), or give "
            "model.source: path for a checkpoint from elsewhere"
        )
    listing = Listing.from_json(json.loads(record.read_text()))
    same_files = (listing.repo, listing.allow_patterns) == (model["repo"], model["allow_patterns"])
    if not same_files or model["revision"] not in (listing.revision, listing.commit):
        raise HubError(
            f"offline, and {checkpoint} holds {listing.repo} revision {listing.revision} (files "
            f"{listing.allow_patterns}), not {model['repo']} revision {model['revision']} (files "
            f"{model['allow_patterns']}): download that once where there is internet"
        )
    return listing


def _unfinished_bytes(checkpoint: Path) -> int:
    """Bytes in temporary files that killed downloads left in the checkpoint's HF metadata folder."""
    return sum(path.stat().st_size for path in (checkpoint / ".cache" / "huggingface").rglob("*.incomplete"))


def _check_disk_space(checkpoint: Path, listing: Listing) -> None:
    """Refuse to start a download that cannot fit (`checkpoint` exists: it holds the listing)."""
    needed = sum(
        f.size
        for f in listing.files
        if not ((checkpoint / f.path).is_file() and (checkpoint / f.path).stat().st_size == f.size)
    )
    free = shutil.disk_usage(checkpoint).free
    if needed > free:
        stale = _unfinished_bytes(checkpoint)
        hint = (
            (
                f"; {_size(stale)} of the disk is held by unfinished downloads that killed runs left in "
                f"{checkpoint}/.cache/huggingface/download (*.incomplete): delete them if no download is "
                "running"
            )
            if stale
            else ""
        )
        raise HubError(
            f"{listing.repo}: the download needs {_size(needed)} more in {checkpoint}, and its "
            f"file system has {_size(free)} free{hint}. Free space, or point model.dir at a file "
            "system with room"
        )


def download_model(model: dict, checkpoint: str | Path) -> dict:
    """Bring the model's files into `checkpoint` (offline: take the ones there), verify every
    one, and write the manifest (files, sizes, sha256, revision, commit). Returns the manifest."""
    checkpoint = Path(checkpoint)
    if is_offline(model):
        listing = _recorded_listing(checkpoint, model)
        digests = _verified(checkpoint, listing, refetch=None)
    else:
        token = resolve_token(model.get("token_file"))
        with hub_errors("model", model, token):
            listing = _hub_listing(model, token)
            atomic_write_text(checkpoint / layout.HUB_LISTING, json.dumps(asdict(listing), indent=2))
            _check_disk_space(checkpoint, listing)
            logging.info(
                "downloading %d files (%s) of %s at commit %s into %s",
                len(listing.files),
                _size(sum(f.size for f in listing.files)),
                listing.repo,
                listing.commit,
                checkpoint,
            )
            download = dict(
                repo_id=listing.repo,
                revision=listing.commit,
                local_dir=checkpoint,
                endpoint=hub_endpoint(model),
                token=token or False,
            )
            huggingface_hub.snapshot_download(allow_patterns=listing.allow_patterns, **download)
            digests = _verified(
                checkpoint,
                listing,
                refetch=lambda path: huggingface_hub.hf_hub_download(filename=path, force_download=True, **download),
            )
    manifest = {
        "repo": listing.repo,
        "revision": listing.revision,
        "commit": listing.commit,
        "allow_patterns": listing.allow_patterns,
        "total_size": sum(f.size for f in listing.files),
        "files": [{"path": f.path, "size": f.size, "sha256": digests[f.path]} for f in listing.files],
    }
    atomic_write_text(checkpoint / layout.MODEL_MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def _verified(checkpoint: Path, listing: Listing, refetch) -> dict[str, str]:
    """sha256 of every listed file, each checked against the Hub's record. A bad file is
    fetched once more with `refetch(path)`; offline (refetch None) it is an error."""
    digests, bad = {}, {}
    for expected in listing.files:
        problem, digests[expected.path] = _problem(expected, checkpoint / expected.path)
        if problem:
            bad[expected.path] = problem
    if bad and refetch is None:
        listed = "; ".join(f"{path}: {problem}" for path, problem in bad.items())
        raise HubError(
            f"offline, and {checkpoint} is not a complete, intact download of {listing.repo} "
            f"(revision {listing.revision}): {listed}. Download it where there is internet"
        )
    for path, problem in bad.items():
        logging.warning("%s/%s: %s; fetching it again", checkpoint, path, problem)
        refetch(path)
        expected = next(f for f in listing.files if f.path == path)
        problem, digests[path] = _problem(expected, checkpoint / path)
        if problem:
            raise HubError(
                f"{checkpoint}/{path}: still wrong after a second download ({problem}); the file on "
                f"{listing.repo} or a proxy in between is damaged. Nothing was marked complete"
            )
    return digests


def link_checkpoint(checkpoint: str, link: str | Path) -> None:
    """Point the experiment's model folder at the shared checkpoint: relative when the
    checkpoint is (so the working directory can move), absolute when it is."""
    link = Path(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    target = checkpoint if os.path.isabs(checkpoint) else os.path.relpath(checkpoint, link.parent)
    partial = link.with_name(link.name + ".partial")
    partial.unlink(missing_ok=True)
    partial.symlink_to(target, target_is_directory=True)
    os.replace(partial, link)


# --- dolly -------------------------------------------------------------------------------------


def dolly_identity(data: dict) -> dict:
    return {key: data[key] for key in DOLLY_IDENTITY[data["source"]]}


def fetch_dolly(data: dict, out_path: str | Path) -> dict:
    """Put the dolly jsonl at `out_path`, from the Hub (via the HF cache), a mirror URL or a
    local file, after checking it against the Hub's record and `data.sha256`. Returns its
    source, size and sha256."""
    with atomic_path(out_path) as partial:
        if data["source"] == "hub":
            cached, sha256 = _dolly_from_hub(data)
            shutil.copyfile(cached, partial)
            source = f"{hub_endpoint(data)}/datasets/{data['repo']} revision {data['revision']}: {data['filename']}"
        elif re.match(r"https?://", data["path"]):
            _download_url(data["path"], partial)
            sha256, source = _digests(partial, git_blob=False)[0], data["path"]
        else:
            shutil.copyfile(data["path"], partial)
            sha256, source = _digests(partial, git_blob=False)[0], data["path"]
        _check_recorded_sha256(data, sha256)
    return {"source": source, "size": Path(out_path).stat().st_size, "sha256": sha256}


def _dolly_from_hub(data: dict) -> tuple[Path, str]:
    """The verified file in the HF cache, and its sha256."""
    token = resolve_token(data.get("token_file"))
    endpoint = hub_endpoint(data)
    download = dict(
        repo_id=data["repo"],
        filename=data["filename"],
        repo_type="dataset",
        revision=data["revision"],
        endpoint=endpoint,
        token=token or False,
    )
    if is_offline(data):
        try:
            cached = Path(huggingface_hub.hf_hub_download(local_files_only=True, **download))
        except LocalEntryNotFoundError:
            raise HubError(
                f"offline (data.offline or HF_HUB_OFFLINE), and {data['filename']} of {data['repo']} "
                f"(revision {data['revision']}) is not in the HF cache {hf_constants.HF_HUB_CACHE}: "
                "download it once where there is internet, with the same HF_HOME"
            ) from None
        return cached, _digests(cached, git_blob=False)[0]
    with hub_errors("data", data, token, repo_type="dataset"):
        url = huggingface_hub.hf_hub_url(
            data["repo"], data["filename"], repo_type="dataset", revision=data["revision"], endpoint=endpoint
        )
        metadata = huggingface_hub.get_hf_file_metadata(url, token=token or False, endpoint=endpoint)
        etag = metadata.etag or ""
        expected = ExpectedFile(
            data["filename"],
            metadata.size,
            sha256=etag if SHA256.fullmatch(etag) else None,
            git_sha1=etag if GIT_SHA1.fullmatch(etag) else None,
        )
        cached = Path(huggingface_hub.hf_hub_download(**download))
        problem, sha256 = _problem(expected, cached)
        if problem:
            logging.warning("%s in the HF cache: %s; fetching it again", data["filename"], problem)
            cached = Path(huggingface_hub.hf_hub_download(force_download=True, **download))
            problem, sha256 = _problem(expected, cached)
            if problem:
                raise HubError(
                    f"{data['filename']} of {data['repo']}: still wrong after a second download "
                    f"({problem}); the file on the Hub or a proxy in between is damaged"
                )
    return cached, sha256


def _download_url(url: str, destination: Path) -> None:
    """A plain mirror URL: no token is sent there (it is not the Hub)."""
    try:
        with open(destination, "wb") as handle:
            http_get(url, handle)
    except HfHubHTTPError as error:
        raise HubError(f"{url}: HTTP {error.response.status_code}") from None
    except (httpx2.HTTPError, OSError) as error:
        raise HubError(f"{url}: download failed ({type(error).__name__}: {error})") from None


def _check_recorded_sha256(data: dict, sha256: str) -> None:
    recorded = data.get("sha256")
    if recorded is None:
        logging.warning(
            "data.sha256 is not set. This file's SHA-256 is %s: record it as data.sha256 so that "
            "every later download, copy or mirror of it is checked against it",
            sha256,
        )
    elif sha256 != recorded:
        raise HubError(
            f"the dolly file has SHA-256 {sha256}, but data.sha256 is {recorded}. If data.revision or "
            "data.path changed on purpose, record the new value; otherwise the file is not the one "
            "recorded"
        )
