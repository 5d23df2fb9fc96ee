"""Real OpenSSH servers on 127.0.0.1 for the transfer tests.

Each `SshServer` is `/usr/sbin/sshd -D -e` with a generated sshd_config, a free port of its own and
a generated ed25519 host key. Every allowed user logs in with the keys in one absolute
AuthorizedKeysFile; sshd reads that file as the user, so it must sit in a folder everyone can
traverse (see `world_readable_dir`). Outside its folders a server touches only what sshd itself
needs as root: the privilege-separation directory /run/sshd.
"""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

# As root the tests log in as this user, created for them (and removed after): file permissions
# apply to it, and its /bin/sh runs no login scripts (root's may be slow, and killing one midway,
# as the dropped-connection tests do, can leave their locks behind).
UNPRIVILEGED_USER = "sftprof-test"

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be started by absolute path
PRIVSEP_DIR = Path("/run/sshd")  # sshd started as root refuses to run without it


def missing_tools() -> str | None:
    """Why these servers cannot run here, or None."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found: apt-get install -y --no-install-recommends openssh-server"
    for tool in ("ssh-keygen", "ssh", "scp"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: apt-get install -y --no-install-recommends openssh-client"
    return None


def generate_key(path: Path, comment: str = "sftprof-test", passphrase: str = "") -> Path:
    """An ed25519 key pair at `path` and `path`.pub, replacing any key already there."""
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def public_key(private_key: Path) -> str:
    return private_key.with_name(private_key.name + ".pub").read_text().strip()


def world_readable_dir(prefix: str) -> Path:
    """A fresh folder under the system temp dir that other users can traverse (pytest's own are 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _children(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        # Fields after the parenthesised command name: state, ppid, ...
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            children.append(int(entry.name))
    return children


def _command_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def processes_of(uid: int) -> list[int]:
    """Processes running as `uid`: what a test user may leave behind once its sessions are gone."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill(pids: list[int]) -> int:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def descendants(pid: int) -> list[int]:
    """All processes below `pid`, parents before children."""
    found, queue = [], [pid]
    while queue:
        for child in _children(queue.pop(0)):
            found.append(child)
            queue.append(child)
    return found


class SshServer:
    """One sshd listening on 127.0.0.1:`port` until `stop()`; `start()` again reuses the port."""

    def __init__(
        self,
        workdir: Path,
        authorized_keys: Path,
        users: list[str],
        *,
        allow_tcp_forwarding: bool = False,
        extra_config: tuple[str, ...] = (),
    ):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.authorized_keys = authorized_keys
        self.users = users
        self.allow_tcp_forwarding = allow_tcp_forwarding
        self.extra_config = extra_config
        self.port = free_port()
        self.host_key = self.workdir / "ssh_host_ed25519_key"
        self.log_path = self.workdir / "sshd.log"
        self.process: subprocess.Popen | None = None

    @property
    def host_public_key(self) -> str:
        """`type base64`, without the comment."""
        return " ".join(public_key(self.host_key).split()[:2])

    @property
    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_public_key}\n"

    def _write_config(self) -> Path:
        config = self.workdir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    "ListenAddress 127.0.0.1",
                    f"Port {self.port}",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.workdir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.authorized_keys}",
                    f"AllowUsers {' '.join(self.users)}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    "StrictModes no",
                    f"AllowTcpForwarding {'yes' if self.allow_tcp_forwarding else 'no'}",
                    "Subsystem sftp internal-sftp",
                    "LogLevel DEBUG1",  # the jump-host test reads the direct-tcpip targets from the log
                    *self.extra_config,
                    "",
                ]
            )
        )
        return config

    def start(self) -> SshServer:
        """Start sshd (generating a host key the first time) and wait until it answers with a banner."""
        if not self.host_key.exists():
            generate_key(self.host_key, comment="sftprof-test-host")
        if os.geteuid() == 0:
            PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        config = self._write_config()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as probe:
                    if probe.recv(64).startswith(b"SSH-2.0-"):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sshd did not answer on port {self.port}:\n{self.log_tail()}")
            time.sleep(0.05)

    def session_pids(self) -> list[int]:
        """The sshd processes serving connections (internal-sftp runs inside them), not the listener."""
        if self.process is None or self.process.poll() is not None:
            return []
        return [pid for pid in descendants(self.process.pid) if _command_name(pid) == "sshd"]

    def drop_sessions(self) -> int:
        """Kill the sshd processes serving connections, as a dropped network would look to the client;
        returns how many. Commands they started see their pipes close and end on their own."""
        return kill(self.session_pids())

    def stop(self) -> None:
        """Stop the listener and everything below it (sessions call setsid, so no process group)."""
        if self.process is None:
            return
        kill(descendants(self.process.pid))
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart_with_new_host_key(self) -> None:
        """Same port, new identity: what a reinstalled (or impersonated) login node looks like."""
        self.stop()
        generate_key(self.host_key, comment="sftprof-test-host-new")
        self.start()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


@contextmanager
def login_user():
    """The user the servers let in: the current one, or as root a throwaway unprivileged one."""
    if os.geteuid() != 0:
        yield getpass.getuser()
        return
    if shutil.which("useradd") is None:
        pytest.skip("running as root without `useradd`: cannot create a user that file permissions apply to")
    created = subprocess.run(["id", "-u", UNPRIVILEGED_USER], capture_output=True).returncode != 0
    if created:
        # Password "*", not the locked "!": sshd without PAM refuses locked accounts, keys or not.
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/",
                "--shell",
                "/bin/sh",
                "--password",
                "*",
                UNPRIVILEGED_USER,
            ],
            check=True,
            capture_output=True,
        )
    try:
        yield UNPRIVILEGED_USER
    finally:
        if created:
            kill(processes_of(pwd.getpwnam(UNPRIVILEGED_USER).pw_uid))  # commands orphaned by dropped sessions
            subprocess.run(["userdel", UNPRIVILEGED_USER], check=True, capture_output=True)
