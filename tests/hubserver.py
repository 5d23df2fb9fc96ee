"""A stand-in for the Hugging Face Hub on 127.0.0.1, for testing the real huggingface_hub client.

It serves what huggingface_hub 2.4 asks for, with the Hub's headers and error codes:

- `GET /api/models/{repo}/revision/{rev}` (`?blobs=True` adds sizes, blob ids and LFS sha256s),
  `GET /api/{models,datasets}/{repo}/tree/{rev}?recursive=True`: JSON as the Hub sends it.
- `HEAD`/`GET /{repo}/resolve/{rev}/{file}` (`/datasets/{repo}/...` for datasets): a git-stored file
  answers 200 with `ETag` = its git blob sha1; an LFS file answers 302 to the CDN with
  `X-Linked-Etag` = its sha256 and `X-Linked-Size`. Both carry `X-Repo-Commit`.
- The CDN is a second server (another port, so another origin: the client must not send it the
  token) that serves LFS content by sha256 and honours `Range` (206 with `Content-Range`).
- Errors as the Hub sends them, by `X-Error-Code`: `RevisionNotFound` (404), `EntryNotFound`
  (404), `RepoNotFound` (404), `GatedRepo` (401 without a token, 403 with one that has no access).

Faults for the tests, each on one file and used up as it is served: `drop_once` ends the body
after N bytes and closes the connection; `corrupt` serves bytes of the right length but wrong
content (`times` times); `fail_once` answers the content GET with HTTP 500.
Every request is logged (server, method, path, Range, Authorization) in `requests`, and every
content GET by file in `bodies`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".model", ".jsonl", ".bin")
LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class HubFile:
    path: str
    content: bytes

    @property
    def is_lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def pointer(self) -> bytes:
        return LFS_POINTER.format(sha256=self.sha256, size=len(self.content)).encode()

    @property
    def blob_id(self) -> str:
        """The git object id: of the LFS pointer for an LFS file, else of the content."""
        return git_blob_sha1(self.pointer if self.is_lfs else self.content)

    def tree_entry(self) -> dict:
        entry = {"type": "file", "oid": self.blob_id, "size": len(self.content), "path": self.path}
        if self.is_lfs:
            entry["lfs"] = {"oid": self.sha256, "size": len(self.content), "pointerSize": len(self.pointer)}
        return entry

    def sibling(self) -> dict:
        entry = {"rfilename": self.path, "size": len(self.content), "blobId": self.blob_id}
        if self.is_lfs:
            entry["lfs"] = {"sha256": self.sha256, "size": len(self.content), "pointerSize": len(self.pointer)}
        return entry


@dataclass
class HubRepo:
    repo_id: str
    repo_type: str  # "model" or "dataset"
    files: dict[str, bytes]
    commit: str = ""
    # Tokens that may read a gated repo's files; None for a public repo.
    gated_tokens: set[str] | None = None

    def __post_init__(self):
        self.commit = self.commit or hashlib.sha1(f"{self.repo_type}/{self.repo_id}".encode()).hexdigest()
        self.entries = {path: HubFile(path, content) for path, content in self.files.items()}

    def resolve(self, revision: str) -> str | None:
        """The commit a branch name or commit hash names (only `main` and the commit exist)."""
        return self.commit if revision in ("main", self.commit) else None


@dataclass
class Request:
    server: str  # "hub" or "cdn"
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class Faults:
    drop_after: dict[str, int] = field(default_factory=dict)
    corrupt: dict[str, int] = field(default_factory=dict)  # path -> bodies still to corrupt
    fail: set[str] = field(default_factory=set)


class HubServer:
    """The Hub API and resolve endpoints on one port, the LFS CDN on another, in daemon threads."""

    def __init__(self, repos: list[HubRepo]):
        self.repos = {(repo.repo_type, repo.repo_id): repo for repo in repos}
        self.requests: list[Request] = []
        self.bodies: list[tuple[str, str | None]] = []  # (file path, Range) of each content GET
        self.faults = Faults()
        self._lock = threading.Lock()
        self.hub = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("hub"))
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), self._handler("cdn"))
        self.hub.daemon_threads = self.cdn.daemon_threads = True
        self._threads = [
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True) for server in (self.hub, self.cdn)
        ]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def cdn_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def __enter__(self) -> HubServer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    def drop_once(self, path: str, after_bytes: int) -> None:
        """The next body served for `path` stops after `after_bytes` and the connection closes."""
        self.faults.drop_after[path] = after_bytes

    def corrupt(self, path: str, times: int = 1) -> None:
        """The next `times` bodies served for `path` have the right length and the wrong bytes."""
        self.faults.corrupt[path] = times

    def fail_once(self, path: str) -> None:
        """The next content GET of `path` answers HTTP 500."""
        self.faults.fail.add(path)

    def downloads(self, path: str) -> list[str | None]:
        """The Range header (None for a whole file) of every GET that served `path`'s content."""
        return [requested for served, requested in self.bodies if served == path]

    @staticmethod
    def _cdn_path(file: HubFile) -> str:
        return f"/lfs/{file.sha256}"

    def _take_faults(self, path: str) -> tuple[bool, int | None, bool]:
        """(fail, drop after N bytes, corrupt) for the body about to be served, each used up."""
        with self._lock:
            fail = path in self.faults.fail
            self.faults.fail.discard(path)
            corrupt = self.faults.corrupt.get(path, 0) > 0
            if corrupt:
                self.faults.corrupt[path] -= 1
            return fail, self.faults.drop_after.pop(path, None), corrupt

    def _file_by_sha256(self, sha256: str) -> HubFile | None:
        for repo in self.repos.values():
            for file in repo.entries.values():
                if file.is_lfs and file.sha256 == sha256:
                    return file
        return None

    def _handler(self, server_name: str):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def do_HEAD(self) -> None:
                self._dispatch()

            def do_GET(self) -> None:
                self._dispatch()

            def _dispatch(self) -> None:
                url = urlsplit(self.path)
                with hub._lock:
                    hub.requests.append(
                        Request(
                            server_name,
                            self.command,
                            url.path,
                            self.headers.get("Range"),
                            self.headers.get("Authorization"),
                        )
                    )
                if server_name == "cdn":
                    file = hub._file_by_sha256(url.path.rsplit("/", 1)[-1]) if url.path.startswith("/lfs/") else None
                    if file is None:
                        return self._reply(404, b"not found")
                    return self._send_content(file)
                parts = [unquote(part) for part in url.path.split("/")]
                if url.path.startswith("/api/"):
                    return self._api(parts[2:], url.query)
                if len(parts) > 1 and parts[1] == "datasets":
                    return self._resolve("dataset", parts[2:])
                return self._resolve("model", parts[1:])

            # /api/{models|datasets}/{org}/{name}/{revision|tree}/{rev}
            def _api(self, parts: list[str], query: str) -> None:
                if len(parts) < 5 or parts[0] not in ("models", "datasets"):
                    return self._reply(404, b"unknown api")
                repo = hub.repos.get((parts[0][:-1], f"{parts[1]}/{parts[2]}"))
                if repo is None:
                    return self._error(404, "RepoNotFound", "Repository not found")
                commit = repo.resolve(parts[4])
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {parts[4]}")
                entries = sorted(repo.entries.values(), key=lambda f: f.path)
                if parts[3] == "revision":
                    with_blobs = "blobs=true" in query.lower()
                    body = {
                        "id": repo.repo_id,
                        "sha": commit,
                        "private": False,
                        "gated": "manual" if repo.gated_tokens is not None else False,
                        "siblings": [f.sibling() if with_blobs else {"rfilename": f.path} for f in entries],
                    }
                elif parts[3] == "tree":
                    body = [f.tree_entry() for f in entries]
                else:
                    return self._reply(404, b"unknown api")
                self._reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

            # /{org}/{name}/resolve/{rev}/{path...}
            def _resolve(self, repo_type: str, parts: list[str]) -> None:
                if len(parts) < 5 or parts[2] != "resolve":
                    return self._reply(404, b"not found")
                repo = hub.repos.get((repo_type, f"{parts[0]}/{parts[1]}"))
                if repo is None:
                    return self._error(404, "RepoNotFound", "Repository not found")
                if repo.gated_tokens is not None:
                    token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                    if not token:
                        return self._error(
                            401,
                            "GatedRepo",
                            f"Access to model {repo.repo_id} is restricted. You must "
                            "have access to it and be authenticated to access it. Please log in.",
                        )
                    if token not in repo.gated_tokens:
                        return self._error(
                            403,
                            "GatedRepo",
                            f"Access to model {repo.repo_id} is restricted and you are not in the authorized list.",
                        )
                commit = repo.resolve(parts[3])
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {parts[3]}")
                file = repo.entries.get("/".join(parts[4:]))
                if file is None:
                    return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
                if file.is_lfs:
                    return self._reply(
                        302,
                        b"",
                        {
                            "Location": f"{hub.cdn_endpoint}{hub._cdn_path(file)}",
                            "X-Repo-Commit": commit,
                            "ETag": f'"{file.blob_id}"',
                            "X-Linked-Etag": f'"{file.sha256}"',
                            "X-Linked-Size": str(len(file.content)),
                        },
                    )
                self._send_content(file, {"X-Repo-Commit": commit, "ETag": f'"{file.blob_id}"'})

            def _send_content(self, file: HubFile, headers: dict | None = None) -> None:
                content, status, headers = file.content, 200, dict(headers or {})
                requested = self.headers.get("Range")
                if requested and requested.startswith("bytes=") and requested.endswith("-"):
                    start = int(requested[len("bytes=") : -1])
                    headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
                    content, status = content[start:], 206
                if self.command == "HEAD":
                    return self._reply(status, b"", headers, content_length=len(content))
                with hub._lock:
                    hub.bodies.append((file.path, requested))
                fail, drop_after, corrupt = hub._take_faults(file.path)
                if fail:
                    return self._reply(500, b"internal error")
                if corrupt:
                    content = bytes(byte ^ 0xFF for byte in content)
                if drop_after is not None:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    self.wfile.write(content[:drop_after])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self._reply(status, content, headers)

            def _error(self, status: int, code: str, message: str, headers: dict | None = None) -> None:
                body = json.dumps({"error": message}).encode()
                self._reply(
                    status,
                    body,
                    {
                        "X-Error-Code": code,
                        "X-Error-Message": message,
                        "Content-Type": "application/json",
                        **(headers or {}),
                    },
                )

            def _reply(
                self, status: int, body: bytes, headers: dict | None = None, content_length: int | None = None
            ) -> None:
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        return Handler
