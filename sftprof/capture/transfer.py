"""Fetch profiling reports from a cluster login node over SSH/SFTP: verified, resumable, atomic.

What a cautious HPC user expects from `scp`, made explicit:
- host keys are checked against known_hosts; an unknown host is refused unless the caller opts in
  with `trust_new_host=True`, and a changed host key is always refused;
- authentication is by key only (identity files, ssh-agent): no password, no prompt;
- a file appears at its final name only after its size and SHA-256 match the remote file's; until
  then it is `.NAME.part` in the same folder, which the next run resumes.

Connection settings come from the ssh config file (HostName, Port, User, IdentityFile, ProxyJump),
so an alias that works with `ssh` works here; explicit `Remote` fields win, as ssh's options do.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import getpass
import hashlib
import logging
import os
import posixpath
import re
import shlex
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import paramiko
from paramiko.auth_strategy import AuthFailure, AuthStrategy, InMemoryPrivateKey, OnDiskPrivateKey
from paramiko.common import OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from sftprof.errors import SftprofError
from sftprof.untrusted import plain_file_name

log = logging.getLogger(__name__)

DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")  # sites often distribute cluster keys here
DEFAULT_IDENTITY_FILES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")

# Throughput: paramiko's defaults (32 KiB reads, 32 KiB packets, so each read reply needs two
# packets) reach about half of what these do. Every OpenSSH sftp-server serves 64 KiB reads; a
# server that serves less still gives correct data, only more slowly.
READ_REQUEST_BYTES = 64 * 1024
MAX_PACKET_BYTES = 128 * 1024
# Put first where the server offers them (paramiko lists them last): AES-GCM encrypts and
# authenticates in one pass, about 25% faster here than AES-CTR plus HMAC; where GCM is not
# offered, encrypt-then-MAC is the sounder construction.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
PREFERRED_MACS = ("hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com")
# Reads are queued a segment at a time: that bounds the memory a download can take and what an
# aborted download must drain, at the cost of one round trip per segment.
SEGMENT_BYTES = 64 * 1024 * 1024
# A server-side `sha256sum` that has not answered after `timeout_s` plus the file at this rate is
# taken for a hung login script (a stale NFS home does that) and replaced by hashing over SFTP.
SLOWEST_REMOTE_HASH_BYTES_PER_S = 10e6
KEEPALIVE_S = 30  # keeps firewalls from closing the connection while the server hashes a big file
MAX_HOPS = 8  # a ProxyJump chain longer than this is taken for a loop in the ssh config
PROGRESS_MIN_BYTES = 16 * 1024 * 1024  # smaller files finish before a progress bar would help

ProgressCallback = Callable[[int, int], None]  # (bytes of the file now local, file size)
T = TypeVar("T")


class TransferError(SftprofError, RuntimeError):
    """A transfer that retrying cannot fix (host key, authentication, missing or unreadable remote
    file, checksum mismatch), or one whose connection kept dropping; the message says which."""


class RemoteNotFound(TransferError):
    """The remote file or directory does not exist (callers fetching optional files skip it)."""


@dataclass(frozen=True)
class Remote:
    """Where to fetch from. `host` may be an alias of the ssh config file.

    `ssh_config` defaults to ~/.ssh/config (if it exists), `known_hosts` to ~/.ssh/known_hosts
    (plus /etc/ssh/ssh_known_hosts, read only). `identity_file` is offered to every hop, jump
    hosts included, before the hop's IdentityFile entries. There is deliberately no password.
    """

    host: str
    port: int | None = None
    user: str | None = None
    identity_file: str | Path | None = None
    ssh_config: str | Path | None = None
    known_hosts: str | Path | None = None
    trust_new_host: bool = False
    use_agent: bool = True
    timeout_s: float = 30.0  # TCP connect, SSH handshake, and the longest wait for data in a transfer


@dataclass(frozen=True)
class FetchResult:
    remote_path: str
    local_path: Path
    size: int
    sha256: str
    skipped: bool  # the local file was already identical, so nothing was transferred
    resumed_from: int  # bytes of an earlier partial download that the final pass kept
    bytes_transferred: int  # bytes received by this call, over all its attempts
    attempts: int  # connections used: more than 1 when one dropped


# --- connection settings ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Hop:
    """One SSH server on the way, with its settings resolved from the ssh config."""

    name: str  # as the user wrote it (often an alias), for messages
    hostname: str
    port: int
    user: str
    identity_files: tuple[Path, ...]
    jumps: tuple[str, ...]  # its ProxyJump hosts, the one to connect to first first

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH (and paramiko) look this host up by in known_hosts."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def _load_ssh_config(path: str | Path | None) -> paramiko.SSHConfig:
    if path is None:
        default = DEFAULT_SSH_CONFIG.expanduser()
        return paramiko.SSHConfig.from_path(default) if default.is_file() else paramiko.SSHConfig()
    path = Path(path).expanduser()
    if not path.exists():  # not is_file(): `/dev/null` is the usual way to say "no config"
        raise TransferError(f"ssh config file not found: {path}")
    return paramiko.SSHConfig.from_path(path)


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` (or `[host]:port`, or an ssh:// URI) -> (user, host, port)."""
    user, _, host_port = spec.removeprefix("ssh://").rpartition("@")
    if host_port.startswith("["):
        host, _, rest = host_port[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = host_port.partition(":")
    return user or None, host, int(port) if port else None


def _resolve(
    name: str,
    config: paramiko.SSHConfig,
    remote: Remote,
    *,
    user: str | None = None,
    port: int | None = None,
    jumps: tuple[str, ...] | None = None,
) -> _Hop:
    entry = config.lookup(name)
    if entry.get("proxycommand", "none").lower() != "none":
        raise TransferError(
            f"{name}: the ssh config sets ProxyCommand, which sftprof does not run; use ProxyJump instead"
        )
    if jumps is None:
        proxy_jump = entry.get("proxyjump", "none")
        jumps = () if proxy_jump.lower() == "none" else tuple(s.strip() for s in proxy_jump.split(","))
    identity_files = [Path(remote.identity_file).expanduser()] if remote.identity_file else []
    identity_files += [Path(p).expanduser() for p in entry.get("identityfile", [])]
    return _Hop(
        name=name,
        hostname=entry.get("hostname", name),
        port=int(port or entry.get("port", 22)),
        user=user or entry.get("user") or getpass.getuser(),
        identity_files=tuple(dict.fromkeys(identity_files)),
        jumps=jumps,
    )


def _route(hop: _Hop, config: paramiko.SSHConfig, remote: Remote) -> list[_Hop]:
    """The hops to connect through, in order, ending with `hop`.

    As in OpenSSH, `ProxyJump a,b` reaches the target through b, and b through a; a single jump
    host's own ProxyJump (from the config) is followed too.
    """
    route = [hop]
    while route[0].jumps:
        if len(route) > MAX_HOPS:
            raise TransferError(
                f"the ProxyJump chain to {hop.name} is longer than {MAX_HOPS} hops; is there a loop in the ssh config?"
            )
        *earlier, nearest = route[0].jumps
        user, host, port = _parse_jump(nearest)
        route.insert(0, _resolve(host, config, remote, user=user, port=port, jumps=tuple(earlier) or None))
    return route


# --- host keys and authentication ------------------------------------------------------------


def _known_hosts_files(remote: Remote) -> tuple[Path, list[Path]]:
    """(the file new keys go to, the existing files keys are checked against)."""
    if remote.known_hosts is not None:
        writable = Path(remote.known_hosts).expanduser()
        candidates = [writable]
    else:
        writable = DEFAULT_KNOWN_HOSTS.expanduser()
        candidates = [writable, SYSTEM_KNOWN_HOSTS]
    return writable, [path for path in candidates if path.is_file()]


def _load_known_hosts(host_keys: paramiko.HostKeys, paths: list[Path]) -> set[str]:
    """Add the keys of OpenSSH known_hosts files to `host_keys`; return the revoked keys (base64).

    paramiko's own loader gives up at the first `@cert-authority` or `@revoked` line. Here a
    `@revoked` key is refused for every host, and `@cert-authority` lines are skipped: paramiko
    cannot check host certificates, so a host known only through one counts as unknown.
    """
    revoked = set()
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@"):
                marker, *fields = line.split()
                if marker == "@revoked" and len(fields) >= 3:
                    revoked.add(fields[2])
                continue
            try:
                entry = HostKeyEntry.from_line(line)
            except (InvalidHostKey, paramiko.SSHException):
                entry = None
            if entry is None:
                log.warning("%s: ignoring a known_hosts line paramiko cannot read: %.80s", path, line)
                continue
            for name in entry.hostnames:
                host_keys.add(name, entry.key.get_name(), entry.key)
    return revoked


def _revoked_host_key(hop: _Hop, key: paramiko.PKey) -> TransferError:
    return TransferError(
        f"the host key of {hop.name} ({hop.known_hosts_name}), {key.get_name()} {key.fingerprint}, "
        "is marked @revoked in known_hosts; refusing to connect"
    )


def _append_known_host(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append, as OpenSSH does: rewriting the file would drop its comments and markers."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path, "a+b") as known:
        known.seek(0, os.SEEK_END)
        if known.tell() > 0:
            known.seek(-1, os.SEEK_END)
            if known.read(1) != b"\n":
                known.write(b"\n")
        known.write(f"{name} {key.get_name()} {key.get_base64()}\n".encode())


class _UnknownHostPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse a host that is not in known_hosts, or, when the caller opted in, trust it and say so."""

    def __init__(self, hop: _Hop, known_hosts: Path, trust_new_host: bool, revoked: set[str]):
        self.hop, self.known_hosts, self.trust_new_host, self.revoked = hop, known_hosts, trust_new_host, revoked

    def missing_host_key(self, client, hostname, key):
        if key.get_base64() in self.revoked:
            raise _revoked_host_key(self.hop, key)
        offered = f"{key.get_name()} key {key.fingerprint}"
        if not self.trust_new_host:
            raise TransferError(
                f"unknown host {self.hop.name} ({hostname}): its {offered} is not in {self.known_hosts}. "
                "Compare the fingerprint with the one your site publishes, then accept it once with "
                f"`ssh {self.hop.name}` or with trust_new_host=True."
            )
        _append_known_host(self.known_hosts, hostname, key)
        print(
            f"sftprof: trusting new host {self.hop.name} ({hostname}), {offered}; added to {self.known_hosts}",
            file=sys.stderr,
        )


def _changed_host_key(hop: _Hop, error: paramiko.BadHostKeyException, checked: list[Path]) -> TransferError:
    expected, got = error.expected_key, error.key
    return TransferError(
        f"HOST KEY CHANGED for {hop.name} ({hop.known_hosts_name}): known_hosts "
        f"({', '.join(map(str, checked))}) has {expected.get_name()} {expected.fingerprint}, the server now "
        f"presents {got.get_name()} {got.fingerprint}. Someone may be intercepting the connection, or the host "
        "was reinstalled; refusing to connect. If your site confirms the new key, remove the old one with "
        f"`ssh-keygen -R '{hop.known_hosts_name}' -f {checked[0]}` and connect again."
    )


class _KeysOnly(AuthStrategy):
    """Public-key authentication only: the hop's identity files, then ssh-agent's keys."""

    def __init__(self, hop: _Hop, use_agent: bool):
        super().__init__(ssh_config=None)
        self.hop, self.use_agent = hop, use_agent
        self.agent: paramiko.Agent | None = None
        self.offered: list[str] = []
        self.problems: list[str] = []

    def get_sources(self):
        # Like OpenSSH, the default key files count only when no IdentityFile is configured.
        paths = self.hop.identity_files or [p for p in map(Path, DEFAULT_IDENTITY_FILES) if p.expanduser().is_file()]
        for path in paths:
            try:
                key = paramiko.PKey.from_path(path)
            except FileNotFoundError:
                self.problems.append(f"identity file {path} does not exist")
                continue
            except TypeError:  # what paramiko raises for a key that needs a passphrase
                self.problems.append(
                    f"{path} needs a passphrase, which sftprof never asks for: "
                    f"load it into ssh-agent with `ssh-add {path}`"
                )
                continue
            except (ValueError, OSError, paramiko.SSHException) as error:
                self.problems.append(f"cannot use identity file {path}: {error}")
                continue
            self.offered.append(f"key file {path}")
            yield OnDiskPrivateKey(self.hop.user, "python-config", path, key)
        if self.use_agent:
            self.agent = paramiko.Agent()
            for key in self.agent.get_keys():
                self.offered.append(f"agent key {key.fingerprint}")
                yield InMemoryPrivateKey(self.hop.user, key)

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()

    def failure(self) -> TransferError:
        offered = ", ".join(self.offered) or "no key at all (no identity file and no agent key)"
        problems = "".join(f"; {problem}" for problem in self.problems)
        return TransferError(
            f"authentication failed for {self.hop.user}@{self.hop.name} "
            f"({self.hop.hostname}:{self.hop.port}): offered {offered}{problems}"
        )


def _preferring(available: tuple[str, ...], preferred: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(name for name in preferred if name in available) + tuple(n for n in available if n not in preferred)


def _transport(sock, **options) -> paramiko.Transport:
    transport = paramiko.Transport(sock, **options)
    security = transport.get_security_options()
    security.ciphers = _preferring(security.ciphers, PREFERRED_CIPHERS)
    security.digests = _preferring(security.digests, PREFERRED_MACS)
    return transport


def _connect_hop(hop: _Hop, sock: paramiko.Channel | None, remote: Remote) -> paramiko.SSHClient:
    known_hosts, checked = _known_hosts_files(remote)
    client = paramiko.SSHClient()
    revoked = _load_known_hosts(client.get_host_keys(), checked)
    client.set_missing_host_key_policy(_UnknownHostPolicy(hop, known_hosts, remote.trust_new_host, revoked))
    keys = _KeysOnly(hop, remote.use_agent)
    try:
        client.connect(
            hop.hostname,
            hop.port,
            username=hop.user,
            sock=sock,
            timeout=remote.timeout_s,
            banner_timeout=remote.timeout_s,
            auth_timeout=remote.timeout_s,
            channel_timeout=remote.timeout_s,
            transport_factory=_transport,
            auth_strategy=keys,
        )
        server_key = client.get_transport().get_remote_server_key()
        if server_key.get_base64() in revoked:  # known, but also revoked
            raise _revoked_host_key(hop, server_key)
        if not client.get_transport().is_authenticated():
            raise TransferError(
                f"{hop.user}@{hop.name} accepted the key but asks for a further step (usually "
                "a password or one-time code); sftprof authenticates with keys only"
            )
        client.get_transport().set_keepalive(KEEPALIVE_S)
        return client
    except BaseException as error:
        client.close()
        if isinstance(error, paramiko.BadHostKeyException):
            raise _changed_host_key(hop, error, checked or [known_hosts]) from None
        if isinstance(error, AuthFailure):
            raise keys.failure() from None
        if isinstance(error, paramiko.ssh_exception.IncompatiblePeer):
            raise TransferError(f"{hop.name}: no SSH algorithms in common with paramiko: {error}") from None
        if isinstance(error, socket.gaierror):
            raise TransferError(f"cannot resolve host name {hop.hostname!r} (of {hop.name}): {error}") from None
        raise
    finally:
        keys.close()


def _forwarded_channel(jump: paramiko.SSHClient, jump_hop: _Hop, hop: _Hop, remote: Remote) -> paramiko.Channel:
    """A `direct-tcpip` channel from the jump host to `hop`: what `ssh -J` uses."""
    try:
        return jump.get_transport().open_channel(
            "direct-tcpip",
            (hop.hostname, hop.port),
            ("127.0.0.1", 0),
            max_packet_size=MAX_PACKET_BYTES,
            timeout=remote.timeout_s,
        )
    except paramiko.ChannelException as error:
        if error.code == OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
            raise TransferError(
                f"jump host {jump_hop.name} refuses to forward connections to {hop.name} "
                f"({hop.hostname}:{hop.port}); its sshd has AllowTcpForwarding off"
            ) from None
        raise  # e.g. "connect failed": the target may be restarting, so this is retried


class _Connection:
    """SSH clients along the route (jump hosts first) and an SFTP session on the last one."""

    def __init__(self, remote: Remote):
        config = _load_ssh_config(remote.ssh_config)
        target = _resolve(remote.host, config, remote, user=remote.user, port=remote.port)
        self.clients: list[paramiko.SSHClient] = []
        try:
            previous: _Hop | None = None
            for hop in _route(target, config, remote):
                sock = _forwarded_channel(self.clients[-1], previous, hop, remote) if previous else None
                self.clients.append(_connect_hop(hop, sock, remote))
                previous = hop
            self.transport = self.clients[-1].get_transport()
            self.sftp = paramiko.SFTPClient.from_transport(self.transport, max_packet_size=MAX_PACKET_BYTES)
            self.sftp.get_channel().settimeout(remote.timeout_s)  # a stalled transfer counts as dropped
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return self.transport.is_active()

    def close(self) -> None:
        for client in reversed(self.clients):
            client.close()

    def open_regular_file(self, path: str, label: str) -> tuple[paramiko.SFTPFile, int]:
        """Open for reading and return (file, size); a problem retrying cannot fix is a TransferError.
        A symbolic link is refused, not followed: a capture's files are written by its job, and a
        link could point anywhere on the cluster."""
        try:
            attributes = self.sftp.lstat(path)
            if stat.S_ISLNK(attributes.st_mode):
                raise TransferError(f"a symbolic link, not followed: {label}")
            if not stat.S_ISREG(attributes.st_mode):
                raise TransferError(f"not a regular file: {label}")
            return self.sftp.open(path, "rb"), attributes.st_size
        except FileNotFoundError:
            raise RemoteNotFound(f"remote file not found: {label}") from None
        except PermissionError:
            raise TransferError(f"permission denied: {label}") from None


# --- reading and hashing -----------------------------------------------------------------------


def _sftp_path(path: str) -> str:
    """SFTP does not expand `~`; its relative paths already start in the home directory."""
    return "." if path == "~" else path.removeprefix("~/")


def _read_from(remote_file: paramiko.SFTPFile, offset: int, size: int, label: str) -> Iterator[bytes]:
    """The file's bytes from `offset` up to `size`, with the reads of a segment queued at once."""
    remote_file.MAX_REQUEST_SIZE = READ_REQUEST_BYTES  # paramiko's own read size is 32 KiB
    remote_file.seek(offset)
    position = offset
    while position < size:
        segment_end = min(position + SEGMENT_BYTES, size)
        remote_file.prefetch(segment_end)
        while position < segment_end:
            chunk = remote_file.read(min(READ_REQUEST_BYTES, segment_end - position))
            if not chunk:
                raise TransferError(
                    f"{label} shrank to {position} bytes while it was read (expected {size}); "
                    "is something still writing it?"
                )
            position += len(chunk)
            yield chunk


def _sha256_of_file(path: Path):  # -> a hashlib sha256 object, to update further
    with open(path, "rb") as local:
        return hashlib.file_digest(local, "sha256")


class _StderrProgress:
    """`NAME  412.0/1024.0 MiB  40%  95.3 MB/s`: redrawn in place on a terminal, else a line every 10 s."""

    def __init__(self, name: str, start: int):
        self.name, self.start = name, start
        self.started = self.drawn = time.monotonic()
        self.interactive = sys.stderr.isatty()

    def __call__(self, position: int, size: int) -> None:
        now = time.monotonic()
        finished = position >= size
        if not finished and now - self.drawn < (0.5 if self.interactive else 10.0):
            return
        self.drawn = now
        rate = (position - self.start) / max(now - self.started, 1e-6)
        line = (
            f"{self.name}  {position / 2**20:.1f}/{size / 2**20:.1f} MiB  {100 * position / max(size, 1):3.0f}%"
            f"  {rate / 1e6:.1f} MB/s"
        )
        if self.interactive:
            sys.stderr.write("\r" + line + ("\n" if finished else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


# --- sessions ------------------------------------------------------------------------------------


class Session:
    """One connection to `remote` (through its jump hosts) for several operations.

    It connects on first use. When the connection drops (EOF, SSH or socket error, a stall longer
    than `remote.timeout_s`) the operation reconnects and resumes, after `backoff_s`, then twice
    that, and so on, `retries` times; then it raises TransferError. Errors that retrying cannot
    fix raise TransferError at once.
    """

    def __init__(self, remote: Remote, *, retries: int = 3, backoff_s: float = 1.0):
        self.remote, self.retries, self.backoff_s = remote, retries, backoff_s
        self._connection: _Connection | None = None
        self._exec_refused = False  # the server ran no `sha256sum` once: hash over SFTP from then on

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _retrying(self, what: str, operation: Callable[[_Connection], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                if self._connection is None:
                    self._connection = _Connection(self.remote)
                return operation(self._connection)
            except TransferError:
                raise
            except (paramiko.SSHException, EOFError, OSError) as error:
                # An OSError on a live connection is local (a full disk, say): retrying won't help.
                dropped = not isinstance(error, OSError) or isinstance(error, (ConnectionError, TimeoutError))
                if not dropped and self._connection is not None and self._connection.alive():
                    raise
                self.close()
                if attempt > self.retries:
                    raise TransferError(
                        f"{what}: gave up after {attempt} attempt{'s' if attempt > 1 else ''}; the "
                        f"connection to {self.remote.host} kept failing. Last error: {error!r}"
                    ) from error
                delay = self.backoff_s * 2 ** (attempt - 1)
                log.warning(
                    "%s: connection to %s lost (%r); reconnecting in %.1f s (retry %d of %d)",
                    what,
                    self.remote.host,
                    error,
                    delay,
                    attempt,
                    self.retries,
                )
                time.sleep(delay)

    def list_files(self, remote_dir: str, *patterns: str) -> list[str]:
        """Paths of the regular files in `remote_dir` whose names match any of `patterns` (fnmatch,
        case-sensitive; default all), sorted. Not recursive; symbolic links are left out."""
        patterns = patterns or ("*",)
        label = f"{self.remote.host}:{remote_dir}"

        def attempt(connection: _Connection) -> list[str]:
            directory = _sftp_path(remote_dir)
            try:
                entries = connection.sftp.listdir_attr(directory)
            except FileNotFoundError:
                raise RemoteNotFound(f"remote directory not found: {label}") from None
            except PermissionError:
                raise TransferError(f"permission denied: {label}") from None
            found = []
            for entry in entries:
                if not any(fnmatch.fnmatchcase(entry.filename, pattern) for pattern in patterns):
                    continue
                if stat.S_ISREG(entry.st_mode):  # links are not followed (see open_regular_file)
                    found.append(posixpath.join(remote_dir, entry.filename))
            return sorted(found)

        return self._retrying(f"listing {label}", attempt)

    def fetch(
        self, remote_path: str, local_path: str | Path, *, progress: bool | ProgressCallback = True
    ) -> FetchResult:
        """Copy one remote file to `local_path`, resuming `.NAME.part` if an earlier try left one.

        `progress`: True draws a bar on stderr for files of 16 MiB or more; a callable gets
        (bytes of the file now local, file size) after every read.
        """
        local_path = Path(local_path)
        partial = local_path.with_name(f".{local_path.name}.part")
        label = f"{self.remote.host}:{remote_path}"
        tally = _Tally()

        def attempt(connection: _Connection) -> FetchResult:
            tally.attempts += 1
            return self._fetch_once(connection, remote_path, local_path, partial, label, progress, tally)

        return self._retrying(f"fetching {label}", attempt)

    def _fetch_once(
        self,
        connection: _Connection,
        remote_path: str,
        local_path: Path,
        partial: Path,
        label: str,
        progress: bool | ProgressCallback,
        tally: _Tally,
    ) -> FetchResult:
        path = _sftp_path(remote_path)
        remote_file, size = connection.open_regular_file(path, label)
        with remote_file:
            remote_sha256 = self._start_remote_sha256(connection, path, size, label)

            def result(sha256: str, *, skipped: bool = False, resumed_from: int = 0) -> FetchResult:
                return FetchResult(
                    remote_path=remote_path,
                    local_path=local_path,
                    size=size,
                    sha256=sha256,
                    skipped=skipped,
                    resumed_from=resumed_from,
                    bytes_transferred=tally.bytes_transferred,
                    attempts=tally.attempts,
                )

            if not local_path.is_symlink() and local_path.is_file() and local_path.stat().st_size == size:
                if _sha256_of_file(local_path).hexdigest() == remote_sha256():
                    partial.unlink(missing_ok=True)
                    log.info("%s: %s is already identical; skipped", label, local_path)
                    return result(remote_sha256(), skipped=True)
                log.info("%s: %s differs from the remote file; replacing it", label, local_path)
            local_path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                offset = _resumable_bytes(partial, size, label)
                started = time.monotonic()
                local_sha256 = _download(
                    remote_file, offset, size, partial, label, _progress_reporter(progress, label, offset, size), tally
                )
                if partial.stat().st_size == size and local_sha256 == remote_sha256():
                    os.replace(partial, local_path)
                    seconds = time.monotonic() - started
                    log.info(
                        "%s -> %s: %d bytes%s in %.1f s (%.1f MB/s), sha256 %s",
                        label,
                        local_path,
                        size,
                        f" (resumed at {offset})" if offset else "",
                        seconds,
                        (size - offset) / max(seconds, 1e-6) / 1e6,
                        local_sha256,
                    )
                    return result(local_sha256, resumed_from=offset)
                partial.unlink()
                if offset == 0 or tally.restarted_from_zero:
                    raise TransferError(
                        f"checksum mismatch for {label} after a full download: the remote file has sha256 "
                        f"{remote_sha256()}, the copy {local_sha256}. Did the file change while it was copied "
                        f"(is a job still writing it)? Nothing was written to {local_path}."
                    )
                tally.restarted_from_zero = True
                log.warning(
                    "%s: the partial download resumed at %d bytes was corrupt (sha256 mismatch); "
                    "deleted it, downloading again from the start",
                    label,
                    offset,
                )

    def _start_remote_sha256(self, connection: _Connection, path: str, size: int, label: str) -> Callable[[], str]:
        """Start `sha256sum` on the server, to run while the download does; returns a function
        that waits for the digest. Where the server runs no commands, it hashes over SFTP."""
        if not self._exec_refused:
            try:
                channel = connection.transport.open_session(timeout=self.remote.timeout_s)
                channel.exec_command(f"sha256sum -- {shlex.quote(path)}")
                channel.shutdown_write()  # a ForceCommand internal-sftp would otherwise wait for input
            except paramiko.SSHException as error:
                if not connection.alive():
                    raise
                self._refuse_exec(label, f"it refused to run a command ({error})")
            else:
                deadline = time.monotonic() + self.remote.timeout_s + size / SLOWEST_REMOTE_HASH_BYTES_PER_S
                return functools.cache(lambda: self._finish_remote_sha256(connection, channel, path, deadline, label))
        return functools.cache(lambda: self._sftp_sha256(connection, path, label))

    def _finish_remote_sha256(
        self, connection: _Connection, channel: paramiko.Channel, path: str, deadline: float, label: str
    ) -> str:
        channel.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            with channel:
                output = channel.makefile("rb").read()
                errors = channel.makefile_stderr("rb").read()
                status = channel.recv_exit_status()
        except TimeoutError:
            if not connection.alive():
                raise
            self._refuse_exec(label, "`sha256sum` did not answer in time (does a login script hang?)")
            return self._sftp_sha256(connection, path, label)
        # The digest line is the last one: a chatty login script may print before it. A leading
        # backslash marks a file name that sha256sum had to escape.
        digests = re.findall(rb"^\\?([0-9a-f]{64}) ", output, re.MULTILINE)
        if status == 0 and digests:
            return digests[-1].decode()
        if not connection.alive():
            raise paramiko.SSHException("connection lost while the server hashed the file")
        message = (errors or output[:300]).decode(errors="replace").strip()[-300:] or "no output"
        self._refuse_exec(label, f"`sha256sum` exited with {status} ({message})")
        return self._sftp_sha256(connection, path, label)

    def _refuse_exec(self, label: str, reason: str) -> None:
        self._exec_refused = True
        log.warning(
            "%s: cannot hash on the server, %s; hashing over SFTP instead, which reads each file a second time",
            label,
            reason,
        )

    def _sftp_sha256(self, connection: _Connection, path: str, label: str) -> str:
        remote_file, size = connection.open_regular_file(path, label)
        digest = hashlib.sha256()
        with remote_file:
            for chunk in _read_from(remote_file, 0, size, label):
                digest.update(chunk)
        return digest.hexdigest()


@dataclass
class _Tally:
    """What one fetch did, over all its attempts."""

    attempts: int = 0
    bytes_transferred: int = 0
    restarted_from_zero: bool = False


def _resumable_bytes(partial: Path, size: int, label: str) -> int:
    try:
        info = partial.lstat()
    except FileNotFoundError:
        return 0
    if stat.S_ISLNK(info.st_mode):
        raise TransferError(f"{partial} is a symbolic link; not writing through it")
    have = info.st_size
    if have > size:
        log.warning("%s: partial download %s is larger than the remote file; starting again", label, partial)
        partial.unlink()
        return 0
    return have


def _progress_reporter(
    progress: bool | ProgressCallback, label: str, offset: int, size: int
) -> ProgressCallback | None:
    if callable(progress):
        return progress
    return _StderrProgress(label, offset) if progress and size >= PROGRESS_MIN_BYTES else None


def _download(
    remote_file: paramiko.SFTPFile,
    offset: int,
    size: int,
    partial: Path,
    label: str,
    report: ProgressCallback | None,
    tally: _Tally,
) -> str:
    """Append the remote bytes from `offset` (the partial's size) on; return the partial's sha256."""
    digest = _sha256_of_file(partial) if offset else hashlib.sha256()
    # O_NOFOLLOW: a link planted at the partial's name must not redirect the write elsewhere.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if offset else os.O_TRUNC)
    try:
        descriptor = os.open(partial, flags, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:  # linked after _resumable_bytes looked
            raise TransferError(f"{partial} is a symbolic link; not writing through it") from None
        raise
    with open(descriptor, "ab" if offset else "wb") as out:
        position = offset
        for chunk in _read_from(remote_file, offset, size, label):
            out.write(chunk)
            digest.update(chunk)
            position += len(chunk)
            tally.bytes_transferred += len(chunk)
            if report is not None:
                report(position, size)
        out.flush()
        os.fsync(out.fileno())  # the final name must never point at data still in flight to disk
    return digest.hexdigest()


# --- one-call helpers ----------------------------------------------------------------------------


def fetch(
    remote: Remote,
    remote_path: str,
    local_path: str | Path,
    *,
    retries: int = 3,
    backoff_s: float = 1.0,
    progress: bool | ProgressCallback = True,
) -> FetchResult:
    """Fetch one file: see `Session.fetch`."""
    with Session(remote, retries=retries, backoff_s=backoff_s) as session:
        return session.fetch(remote_path, local_path, progress=progress)


def fetch_many(
    remote: Remote,
    pairs: Iterable[tuple[str, str | Path]],
    *,
    retries: int = 3,
    backoff_s: float = 1.0,
    progress: bool | ProgressCallback = True,
) -> list[FetchResult]:
    """Fetch (remote path, local path) pairs over one connection, in order; stops at the first error
    (the files fetched before it are complete and verified)."""
    with Session(remote, retries=retries, backoff_s=backoff_s) as session:
        return [session.fetch(remote_path, local_path, progress=progress) for remote_path, local_path in pairs]


def list_remote(remote: Remote, remote_dir: str, *patterns: str, retries: int = 3, backoff_s: float = 1.0) -> list[str]:
    """Remote paths of the files in `remote_dir` matching any of `patterns`: see `Session.list_files`."""
    with Session(remote, retries=retries, backoff_s=backoff_s) as session:
        return session.list_files(remote_dir, *patterns)


def fetch_matching(
    remote: Remote,
    remote_dir: str,
    local_dir: str | Path,
    *patterns: str,
    retries: int = 3,
    backoff_s: float = 1.0,
    progress: bool | ProgressCallback = True,
) -> list[FetchResult]:
    """Fetch every file of `remote_dir` matching `patterns` (e.g. every rank's report) into
    `local_dir`, keeping names, over one connection. Matching nothing is an error: it usually
    means a wrong directory or pattern."""
    with Session(remote, retries=retries, backoff_s=backoff_s) as session:
        paths = session.list_files(remote_dir, *patterns)
        if not paths:
            raise TransferError(f"no file in {remote.host}:{remote_dir} matches {' '.join(patterns or ('*',))}")
        local_paths = [
            Path(local_dir) / plain_file_name(posixpath.basename(path), f"{remote.host}:{remote_dir}") for path in paths
        ]  # every name checked before the first file is written
        return [session.fetch(path, local_path, progress=progress) for path, local_path in zip(paths, local_paths)]
