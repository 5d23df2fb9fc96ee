"""sftprof.capture.transfer against real OpenSSH servers on loopback (tests/sshd.py): host-key trust,
key-only authentication, ProxyJump, resume after a killed connection, integrity checks."""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sftprof.capture import transfer
from sftprof.capture.transfer import Remote, TransferError

from sshd import SshServer, generate_key, login_user, missing_tools, public_key, world_readable_dir

MiB = 2**20
SIZES = {"empty.bin": 0, "small.log": 1234, "medium.bin": 3 * MiB, "large.nsys-rep": 200 * MiB, "fault.bin": 48 * MiB}


def write_random(path: Path, size: int) -> None:
    with open(path, "wb") as out:
        for start in range(0, size, 8 * MiB):
            out.write(os.urandom(min(8 * MiB, size - start)))


def sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def fingerprint(server: SshServer) -> str:
    """The server's host key fingerprint as OpenSSH prints it (SHA256:base64)."""
    public = server.host_key.with_name(server.host_key.name + ".pub")
    return subprocess.run(
        ["ssh-keygen", "-lf", str(public)], check=True, capture_output=True, text=True
    ).stdout.split()[1]


class SshWorld:
    """Two servers (a target and a jump host that forwards), one client key, a known_hosts file
    with both host keys, and the remote files, in a folder every test user can read."""

    def __init__(self, base: Path, workdir: Path, user: str):
        self.base, self.workdir, self.user = base, workdir, user
        self.files = base / "files"
        self.files.mkdir()
        self.key = generate_key(workdir / "id_ed25519")
        self.authorized_keys = base / "authorized_keys"
        self.authorized_keys.write_text(public_key(self.key) + "\n")
        self.authorized_keys.chmod(0o644)
        self.users = [user]
        self.known_hosts = workdir / "known_hosts"
        self.empty_ssh_config = workdir / "ssh_config"  # so that no test reads the real ~/.ssh/config
        self.empty_ssh_config.write_text("")
        for name, size in SIZES.items():
            write_random(self.files / name, size)
        self.servers: list[SshServer] = []

    def start(self) -> None:
        self.target = self.server("target")
        self.jump = self.server("jump", allow_tcp_forwarding=True)

    def remote(self, server: SshServer | None = None, **overrides) -> Remote:
        settings = dict(
            host="127.0.0.1",
            port=(server or self.target).port,
            user=self.user,
            identity_file=self.key,
            ssh_config=self.empty_ssh_config,
            known_hosts=self.known_hosts,
            use_agent=False,
            timeout_s=10,
        )
        return Remote(**{**settings, **overrides})

    def server(self, name: str, **options) -> SshServer:
        """An extra server, known in `known_hosts` and stopped with the others."""
        server = SshServer(self.workdir / name, self.authorized_keys, self.users, **options)
        self.servers.append(server)
        server.start()
        with open(self.known_hosts, "a") as known_hosts:
            known_hosts.write(server.known_hosts_line)
        return server


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    base = world_readable_dir("sftprof-transfer-")
    try:
        with login_user() as user:
            world = SshWorld(base, tmp_path_factory.mktemp("ssh"), user)
            try:
                world.start()
                yield world
            finally:
                for server in world.servers:
                    server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def no_reconnects(caplog) -> bool:
    return not [r for r in caplog.records if "reconnecting" in r.getMessage()]


def test_fetches_files_of_every_size_byte_identical_over_one_connection(world, tmp_path, capsys):
    names = ["empty.bin", "small.log", "medium.bin", "large.nsys-rep"]
    results = transfer.fetch_many(world.remote(), [(str(world.files / n), tmp_path / "got" / n) for n in names])
    for name, result in zip(names, results):
        assert result.size == SIZES[name] and result.bytes_transferred == SIZES[name]
        assert result.sha256 == sha256(world.files / name) == sha256(tmp_path / "got" / name)
        assert not result.skipped and result.resumed_from == 0 and result.attempts == 1
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == sorted(names)  # no .part left behind
    assert "large.nsys-rep  200.0/200.0 MiB  100%" in capsys.readouterr().err  # only the large file has a bar


def test_an_identical_local_file_is_skipped_and_a_different_one_replaced(world, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sftprof.capture.transfer")
    source, local = world.files / "medium.bin", tmp_path / "medium.bin"
    transfer.fetch(world.remote(), str(source), local)
    again = transfer.fetch(world.remote(), str(source), local)
    assert again.skipped and again.bytes_transferred == 0 and again.sha256 == sha256(source)

    local.write_bytes(b"x" * SIZES["medium.bin"])  # same size, other content
    replaced = transfer.fetch(world.remote(), str(source), local)
    assert not replaced.skipped and replaced.bytes_transferred == SIZES["medium.bin"]
    assert sha256(local) == sha256(source)
    assert "differs from the remote file; replacing it" in caplog.text


def test_a_file_name_with_shell_characters_is_hashed_on_the_server(world, tmp_path, caplog):
    odd = world.files / "odd name 'quoted' $(touch pwned) back\\slash.log"  # sha256sum escapes the backslash
    odd.write_bytes(os.urandom(5000))
    result = transfer.fetch(world.remote(), str(odd), tmp_path / "odd.log")
    assert result.sha256 == sha256(odd) == sha256(tmp_path / "odd.log")
    assert "hashing over SFTP instead" not in caplog.text
    assert not (Path(pwd.getpwnam(world.user).pw_dir) / "pwned").exists()  # where the server ran sha256sum


def drop_connection_after(server: SshServer, after_bytes: int):
    """A progress callback that kills the sshd processes serving the transfer, once."""
    state = {"dropped": False}

    def progress(position: int, size: int) -> None:
        if position >= after_bytes and not state["dropped"]:
            state["dropped"] = True
            assert server.drop_sessions() > 0

    return progress


def test_a_connection_killed_mid_transfer_reconnects_and_resumes(world, tmp_path, caplog):
    source, local = world.files / "fault.bin", tmp_path / "fault.bin"
    size = SIZES["fault.bin"]
    result = transfer.fetch(
        world.remote(),
        str(source),
        local,
        retries=2,
        backoff_s=0.1,
        progress=drop_connection_after(world.target, 16 * MiB),
    )
    assert result.attempts == 2 and 16 * MiB <= result.resumed_from < size
    assert result.bytes_transferred == size  # nothing received twice: the resume kept every byte written
    assert sha256(local) == sha256(source) == result.sha256
    assert not (tmp_path / ".fault.bin.part").exists()
    assert "connection to 127.0.0.1 lost" in caplog.text


def test_a_failed_fetch_leaves_only_a_partial_and_the_next_run_resumes_it(world, tmp_path):
    source, local = world.files / "fault.bin", tmp_path / "fault.bin"
    size = SIZES["fault.bin"]
    with pytest.raises(TransferError, match=r"gave up after 1 attempt; the connection to 127\.0\.0\.1 kept failing"):
        transfer.fetch(
            world.remote(), str(source), local, retries=0, progress=drop_connection_after(world.target, 20 * MiB)
        )
    partial = tmp_path / ".fault.bin.part"
    assert not local.exists() and 20 * MiB <= partial.stat().st_size < size

    kept = partial.stat().st_size
    result = transfer.fetch(world.remote(), str(source), local, retries=0)
    assert result.resumed_from == kept and result.bytes_transferred == size - kept < size
    assert sha256(local) == sha256(source) and not partial.exists()


def test_a_corrupt_partial_is_detected_deleted_and_fetched_again_from_zero(world, tmp_path, caplog):
    source, local = world.files / "medium.bin", tmp_path / "medium.bin"
    size = SIZES["medium.bin"]
    (tmp_path / ".medium.bin.part").write_bytes(os.urandom(size // 2))  # right length for a resume, wrong bytes
    result = transfer.fetch(world.remote(), str(source), local)
    assert result.resumed_from == 0 and result.bytes_transferred == (size - size // 2) + size
    assert sha256(local) == sha256(source)
    assert "was corrupt (sha256 mismatch)" in caplog.text


def test_a_changed_host_key_is_refused_naming_both_fingerprints_and_nothing_is_written(world, tmp_path):
    server = world.server("rekeyed")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(server.known_hosts_line)
    old = fingerprint(server)
    transfer.fetch(world.remote(server, known_hosts=known_hosts), str(world.files / "small.log"), tmp_path / "ok")

    server.restart_with_new_host_key()
    new = fingerprint(server)
    known_before = known_hosts.read_text()
    destination = tmp_path / "out" / "small.log"
    for trust_new_host in (False, True):  # opting in to new hosts never accepts a changed one
        with pytest.raises(TransferError) as refused:
            transfer.fetch(
                world.remote(server, known_hosts=known_hosts, trust_new_host=trust_new_host),
                str(world.files / "small.log"),
                destination,
            )
        message = str(refused.value)
        assert f"HOST KEY CHANGED for 127.0.0.1 ([127.0.0.1]:{server.port})" in message
        assert old in message and new in message and "ssh-keygen -R" in message
    assert not (tmp_path / "out").exists()
    assert known_hosts.read_text() == known_before


def test_an_unknown_host_is_refused_without_opt_in(world, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(world.jump.known_hosts_line)  # knows another host only
    with pytest.raises(TransferError, match=r"unknown host 127\.0\.0\.1 .*is not in") as refused:
        transfer.fetch(world.remote(known_hosts=known_hosts), str(world.files / "small.log"), tmp_path / "out" / "f")
    assert fingerprint(world.target) in str(refused.value)
    assert not (tmp_path / "out").exists()
    assert known_hosts.read_text() == world.jump.known_hosts_line


def test_an_unknown_host_is_trusted_with_opt_in_its_fingerprint_printed_and_remembered(world, tmp_path, capsys):
    known_hosts = tmp_path / "ssh" / "known_hosts"  # not there yet, nor its folder
    source = world.files / "small.log"
    transfer.fetch(world.remote(known_hosts=known_hosts, trust_new_host=True), str(source), tmp_path / "a")
    expected = fingerprint(world.target)
    assert (
        f"trusting new host 127.0.0.1 ([127.0.0.1]:{world.target.port}), ssh-ed25519 key {expected}"
        in capsys.readouterr().err
    )
    assert known_hosts.read_text() == world.target.known_hosts_line
    # OpenSSH finds the entry, and the next connection needs no opt-in.
    subprocess.run(
        ["ssh-keygen", "-F", f"[127.0.0.1]:{world.target.port}", "-f", str(known_hosts)],
        check=True,
        capture_output=True,
    )
    assert transfer.fetch(world.remote(known_hosts=known_hosts), str(source), tmp_path / "b").sha256 == sha256(source)
    assert "trusting" not in capsys.readouterr().err


def test_known_hosts_with_markers_and_hashed_names_is_read_and_a_revoked_key_refused(world, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    certificate_authority = generate_key(tmp_path / "ca")
    known_hosts.write_text(
        f"# site keys\n@cert-authority *.cluster.example {public_key(certificate_authority)}\n"
        + world.target.known_hosts_line
    )
    # Hashed names, as Debian's ssh writes them (HashKnownHosts yes).
    subprocess.run(["ssh-keygen", "-H", "-f", str(known_hosts)], check=True, capture_output=True)
    assert "127.0.0.1" not in known_hosts.read_text()
    source = world.files / "small.log"
    assert transfer.fetch(world.remote(known_hosts=known_hosts), str(source), tmp_path / "a").sha256 == sha256(source)

    revoked_line = f"@revoked * {world.target.host_public_key}\n"
    with open(known_hosts, "a") as known:
        known.write(revoked_line)
    only_revoked = tmp_path / "only_revoked"
    only_revoked.write_text(revoked_line)
    for known_hosts_file, trust_new_host in [(known_hosts, False), (known_hosts, True), (only_revoked, True)]:
        with pytest.raises(TransferError, match=r"127\.0\.0\.1 .*is marked @revoked in known_hosts; refusing"):
            transfer.fetch(
                world.remote(known_hosts=known_hosts_file, trust_new_host=trust_new_host), str(source), tmp_path / "b"
            )
    assert only_revoked.read_text() == revoked_line and not (tmp_path / "b").exists()


def test_a_missing_remote_file_is_a_clear_error_and_not_retried(world, tmp_path, caplog):
    missing = world.files / "no-such-report.nsys-rep"
    with pytest.raises(TransferError, match=f"^remote file not found: 127.0.0.1:{missing}$"):
        transfer.fetch(world.remote(), str(missing), tmp_path / "x", backoff_s=30)
    assert no_reconnects(caplog) and not (tmp_path / "x").exists()


def test_an_unreadable_remote_file_is_permission_denied_and_not_retried(world, tmp_path, caplog):
    locked = world.files / "locked.log"
    locked.write_text("secret")
    locked.chmod(0o000)
    with pytest.raises(TransferError, match=f"^permission denied: 127.0.0.1:{locked}$"):
        transfer.fetch(world.remote(), str(locked), tmp_path / "x", backoff_s=30)
    assert no_reconnects(caplog) and not list(tmp_path.iterdir())


def test_a_wrong_user_fails_authentication_clearly_and_is_not_retried(world, tmp_path, caplog):
    with pytest.raises(TransferError, match=f"authentication failed for no-such-user@127.0.0.1 .*{world.key}"):
        transfer.fetch(world.remote(user="no-such-user"), str(world.files / "small.log"), tmp_path / "x", backoff_s=30)
    assert no_reconnects(caplog)


def test_a_server_wanting_a_second_factor_is_a_clear_error_not_a_prompt(world, tmp_path, caplog):
    server = world.server("two-factor", extra_config=("AuthenticationMethods publickey,publickey",))
    with pytest.raises(TransferError, match=f"{world.user}@127.0.0.1 accepted the key but asks for a further step"):
        transfer.fetch(world.remote(server), str(world.files / "small.log"), tmp_path / "x", backoff_s=30)
    assert no_reconnects(caplog)


def test_a_passphrase_key_is_used_through_ssh_agent_and_never_prompted_for(world, tmp_path, monkeypatch):
    key = generate_key(tmp_path / "id_locked", passphrase="correct horse")
    with open(world.authorized_keys, "a") as authorized:
        authorized.write(public_key(key) + "\n")
    with pytest.raises(TransferError, match=f"{key} needs a passphrase.*ssh-add {key}"):
        transfer.fetch(world.remote(identity_file=key), str(world.files / "small.log"), tmp_path / "x")

    agent_socket = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_socket)], stdout=subprocess.DEVNULL)
    try:
        askpass = tmp_path / "askpass"
        askpass.write_text("#!/bin/sh\necho 'correct horse'\n")
        askpass.chmod(0o700)
        while not agent_socket.exists():
            time.sleep(0.02)
        subprocess.run(
            ["ssh-add", str(key)],
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            env={
                **os.environ,
                "SSH_AUTH_SOCK": str(agent_socket),
                "SSH_ASKPASS": str(askpass),
                "SSH_ASKPASS_REQUIRE": "force",
            },
        )
        monkeypatch.setenv("SSH_AUTH_SOCK", str(agent_socket))
        result = transfer.fetch(
            world.remote(identity_file=key, use_agent=True), str(world.files / "small.log"), tmp_path / "small.log"
        )
        assert result.sha256 == sha256(world.files / "small.log")
    finally:
        agent.terminate()
        agent.wait()


def ssh_config(world, path: Path, target_jumps: str) -> Path:
    path.write_text(f"""
Host jumpalias jump2
  HostName 127.0.0.1
  Port {world.jump.port}
  User {world.user}
  IdentityFile {world.key}

Host cluster
  HostName 127.0.0.1
  Port {world.target.port}
  User {world.user}
  IdentityFile {world.key}
  ProxyJump {target_jumps}
""")
    return path


def forwarded_to(server: SshServer, port: int) -> int:
    """How many direct-tcpip channels `server` opened to 127.0.0.1:`port`."""
    return server.log_tail(10**7).count(f"target 127.0.0.1 port {port}")


@pytest.mark.parametrize("jumps, hops_through_jump_host", [("jumpalias", 1), ("jumpalias,jump2", 2)])
def test_proxyjump_from_an_ssh_config_alias(world, tmp_path, jumps, hops_through_jump_host):
    config = ssh_config(world, tmp_path / "ssh_config", jumps)
    before = (forwarded_to(world.jump, world.target.port), forwarded_to(world.jump, world.jump.port))
    remote = Remote(host="cluster", ssh_config=config, known_hosts=world.known_hosts, use_agent=False, timeout_s=10)
    source = world.files / "medium.bin"
    result = transfer.fetch(remote, str(source), tmp_path / "medium.bin")
    assert result.sha256 == sha256(source) == sha256(tmp_path / "medium.bin")
    after = (forwarded_to(world.jump, world.target.port), forwarded_to(world.jump, world.jump.port))
    assert after[0] == before[0] + 1  # the target was reached through the jump host
    assert after[1] == before[1] + hops_through_jump_host - 1  # and, for a chain, the jump host through itself


def test_the_jump_host_key_is_verified_too(world, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(world.target.known_hosts_line)  # the target only
    remote = Remote(
        host="cluster",
        ssh_config=ssh_config(world, tmp_path / "ssh_config", "jumpalias"),
        known_hosts=known_hosts,
        use_agent=False,
    )
    with pytest.raises(TransferError, match=f"unknown host jumpalias \\(\\[127.0.0.1\\]:{world.jump.port}\\)"):
        transfer.fetch(remote, str(world.files / "small.log"), tmp_path / "x")
    assert known_hosts.read_text() == world.target.known_hosts_line and not (tmp_path / "x").exists()


def test_a_jump_host_that_does_not_forward_is_a_clear_error(world, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(f"""
Host nofwd
  HostName 127.0.0.1
  Port {world.target.port}
  User {world.user}
Host viafwd
  HostName 127.0.0.1
  Port {world.jump.port}
  User {world.user}
  ProxyJump nofwd
""")
    remote = Remote(
        host="viafwd", identity_file=world.key, ssh_config=config, known_hosts=world.known_hosts, use_agent=False
    )
    with pytest.raises(TransferError, match="jump host nofwd refuses to forward connections to viafwd"):
        transfer.fetch(remote, str(world.files / "small.log"), tmp_path / "x", backoff_s=30)


def test_a_server_down_for_good_is_retried_with_backoff_then_a_clear_error(world, tmp_path, caplog):
    server = world.server("down")
    server.stop()
    started = time.monotonic()
    with pytest.raises(TransferError, match="gave up after 3 attempts; the connection to 127.0.0.1 kept failing"):
        transfer.fetch(world.remote(server), str(world.files / "small.log"), tmp_path / "x", retries=2, backoff_s=0.2)
    assert time.monotonic() - started >= 0.2 + 0.4  # backoff doubled between the two retries
    assert len([r for r in caplog.records if "reconnecting in" in r.getMessage()]) == 2
    assert not (tmp_path / "x").exists()


def test_without_commands_on_the_server_the_hash_is_taken_over_sftp(world, tmp_path, caplog):
    server = world.server("sftp-only", extra_config=("ForceCommand internal-sftp",))
    source = world.files / "medium.bin"
    results = transfer.fetch_many(world.remote(server), [(str(source), tmp_path / "a"), (str(source), tmp_path / "b")])
    assert [r.sha256 for r in results] == [sha256(source)] * 2
    fallbacks = [r for r in caplog.records if "hashing over SFTP instead" in r.getMessage()]
    assert len(fallbacks) == 1  # said once per session, not once per file


def test_a_hanging_remote_command_falls_back_to_hashing_over_sftp(world, tmp_path, caplog):
    """As when a login script hangs on a stale NFS mount: the fetch must still finish."""
    sftp_server = "/usr/lib/openssh/sftp-server"
    if not os.access(sftp_server, os.X_OK):
        pytest.skip(f"{sftp_server} not found")
    hang = world.base / "hang-commands"
    hang.write_text(
        f'#!/bin/sh\ncase "$SSH_ORIGINAL_COMMAND" in\n  sha256sum*) sleep 5 ;;\n  *) exec {sftp_server} ;;\nesac\n'
    )
    hang.chmod(0o755)
    server = world.server("hanging-commands", extra_config=(f"ForceCommand {hang}",))
    source = world.files / "medium.bin"
    started = time.monotonic()
    result = transfer.fetch(world.remote(server, timeout_s=1), str(source), tmp_path / "medium.bin")
    assert result.sha256 == sha256(source) == sha256(tmp_path / "medium.bin")
    assert "`sha256sum` did not answer in time" in caplog.text and time.monotonic() - started < 10


def test_listing_and_fetching_every_rank_report_of_a_remote_directory(world, tmp_path):
    run = world.files / "run"
    run.mkdir()
    for rank in range(3):
        (run / f"profile.rank{rank}.nsys-rep").write_bytes(os.urandom(1000 + rank))
    (run / "train.log").write_text("log\n")
    (run / "folder.nsys-rep").mkdir()  # matches the pattern but is no file
    (run / "latest.nsys-rep").symlink_to("profile.rank2.nsys-rep")  # links are not followed
    expected = ["profile.rank0.nsys-rep", "profile.rank1.nsys-rep", "profile.rank2.nsys-rep"]
    assert transfer.list_remote(world.remote(), str(run), "*.nsys-rep") == [str(run / n) for n in expected]
    assert transfer.list_remote(world.remote(), str(run), "*.log", "*rank0*") == [
        str(run / "profile.rank0.nsys-rep"),
        str(run / "train.log"),
    ]

    results = transfer.fetch_matching(world.remote(), str(run), tmp_path / "reports", "*.nsys-rep", "*.log")
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == sorted([*expected, "train.log"])
    assert all(sha256(r.local_path) == sha256(run / r.local_path.name) for r in results)
    with pytest.raises(TransferError, match="no file in 127.0.0.1:.* matches \\*.sqlite"):
        transfer.fetch_matching(world.remote(), str(run), tmp_path / "none", "*.sqlite")
    with pytest.raises(TransferError, match="remote directory not found"):
        transfer.list_remote(world.remote(), str(run / "nope"))


def test_ssh_config_mistakes_are_clear_errors_before_any_connection(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host a\n  ProxyJump b\nHost b\n  ProxyJump a\nHost proxied\n  ProxyCommand ssh -W %h:%p gateway\n"
    )
    with pytest.raises(TransferError, match="longer than 8 hops; is there a loop"):
        transfer.fetch(Remote("a", ssh_config=config), "/x", tmp_path / "x", backoff_s=30)
    with pytest.raises(TransferError, match="proxied: the ssh config sets ProxyCommand.*use ProxyJump"):
        transfer.fetch(Remote("proxied", ssh_config=config), "/x", tmp_path / "x", backoff_s=30)
    with pytest.raises(TransferError, match="ssh config file not found"):
        transfer.fetch(Remote("a", ssh_config=tmp_path / "missing"), "/x", tmp_path / "x", backoff_s=30)
    assert list(tmp_path.iterdir()) == [config]


# --- the workflow and the CLI, fetching from a cluster whose files the test sshd serves -------


def cluster_workdir(world, demo_run) -> Path:
    """The cluster side: a workflow working directory holding the demo's finished results."""
    workdir = world.base / "cluster"
    if not workdir.exists():
        shutil.copytree(demo_run / "results", workdir / "results")
        shutil.copytree(demo_run / "logs", workdir / "logs")
        subprocess.run(["chmod", "-R", "a+rX", str(workdir)], check=True)
    return workdir


def workstation_config(world, demo_run, analysis_on: str) -> dict:
    from conftest import SMALL_DEMO

    remote = world.remote()
    return {
        **SMALL_DEMO,
        "results_from": "remote",
        "remote": {
            "host": remote.host,
            "port": remote.port,
            "user": remote.user,
            "identity_file": str(remote.identity_file),
            "ssh_config": str(remote.ssh_config),
            "known_hosts": str(remote.known_hosts),
            "use_agent": False,
            "workdir": str(cluster_workdir(world, demo_run)),
            "analysis_on": analysis_on,
        },
    }


@pytest.mark.e2e
def test_workflow_fetches_each_capture_and_analyses_it_here(world, demo_run, tmp_path):
    from conftest import snakemake, write_config

    write_config(tmp_path, workstation_config(world, demo_run, "workstation"))
    result = snakemake(tmp_path)
    assert "fetch_capture" in result.stderr and "profile_sft" not in result.stderr
    remote_capture = world.base / "cluster" / "results" / "demo" / "steady" / "capture"
    local_capture = tmp_path / "results" / "demo" / "steady" / "capture"
    for name in ("rank0.json", "profile.nsys-rep", "profile.rank0.metrics.jsonl"):
        assert sha256(local_capture / name) == sha256(remote_capture / name)
    # The run's log comes along; no Slurm output exists for a run that was not submitted.
    remote_log = world.base / "cluster" / "logs" / "demo" / "steady" / "profile.log"
    assert sha256(local_capture / "profile.log") == sha256(remote_log)
    assert not list(local_capture.glob("slurm-*"))
    html = (tmp_path / "results" / "demo" / "steady" / "report.html").read_text()
    assert "Rank 0 on" in html and "Step time by phase" in html


@pytest.mark.e2e
def test_workflow_fetches_only_the_report_when_the_cluster_analysed(world, demo_run, tmp_path):
    from conftest import snakemake, write_config

    write_config(tmp_path, workstation_config(world, demo_run, "cluster"))
    result = snakemake(tmp_path)
    assert "fetch_report" in result.stderr and "fetch_capture" not in result.stderr
    assert not (tmp_path / "results" / "demo" / "steady" / "capture").exists()
    fetched = tmp_path / "results" / "demo" / "steady" / "report.html"
    assert sha256(fetched) == sha256(world.base / "cluster" / "results" / "demo" / "steady" / "report.html")


@pytest.mark.e2e
def test_cli_fetch_refuses_an_unknown_host_until_trusted_then_skips_identical_files(world, demo_run, tmp_path):
    import sys

    from conftest import write_config

    config = workstation_config(world, demo_run, "workstation")
    config["remote"]["known_hosts"] = str(tmp_path / "fresh_known_hosts")
    write_config(tmp_path, config)
    sftprof = [str(Path(sys.executable).with_name("sftprof")), "fetch", "demo", "steady"]
    refused = subprocess.run(sftprof, capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 1 and "unknown host" in refused.stderr and "Traceback" not in refused.stderr
    assert fingerprint(world.target) in refused.stderr
    assert not (tmp_path / "results").exists()

    trusted = subprocess.run([*sftprof, "--trust-new-host"], capture_output=True, text=True, cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    assert "trusting new host" in trusted.stderr and fingerprint(world.target) in trusted.stderr
    assert (tmp_path / "results" / "demo" / "steady" / "capture" / "profile.nsys-rep").exists()

    again = subprocess.run(sftprof, capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("(already here)") == 4
