"""A hostile or compromised cluster, served by a real sshd on loopback: `sftprof fetch` must write
nothing outside the workflow's folder, follow no link, keep the last good capture, and refuse in
one line (the hostile-input tally's class "transfer")."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sftprof.capture import transfer

from conftest import SMALL_DEMO, assert_refused, run_sftprof, tree_state
from sshd import SshServer, generate_key, login_user, missing_tools, public_key, world_readable_dir

CAPTURE = Path("results/demo/steady/capture")
STAGING = Path("resources/fetched/demo/steady")
GOOD_RECORD = {
    "rank": 0,
    "world_size": 1,
    "host": "node1",
    "node": 0,
    "slurm_job_id": "123",
    "report": "profile.nsys-rep",
}


@dataclass
class Cluster:
    base: Path  # world-readable: the login user must read what the server serves
    server: SshServer
    user: str
    key: Path
    known_hosts: Path
    ssh_config: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    base = world_readable_dir("sftprof-hostile-")
    local = tmp_path_factory.mktemp("hostile-ssh")
    try:
        with login_user() as user:
            key = generate_key(local / "id_ed25519")
            authorized_keys = base / "authorized_keys"
            authorized_keys.write_text(public_key(key) + "\n")
            authorized_keys.chmod(0o644)
            server = SshServer(local / "sshd", authorized_keys, [user]).start()
            try:
                known_hosts, ssh_config = local / "known_hosts", local / "ssh_config"
                known_hosts.write_text(server.known_hosts_line)
                ssh_config.write_text("")
                yield Cluster(base, server, user, key, known_hosts, ssh_config)
            finally:
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Setup:
    remote: Path  # the cluster's capture folder
    workdir: Path  # the workstation's workflow folder: everything sftprof may write is below it
    outside: Path  # beside the workflow folder: must never change

    def fetch(self):
        return run_sftprof("fetch", "demo", "steady", cwd=self.workdir, timeout=120)

    def write_record(self, record, name: str = "rank0.json") -> None:
        """`record` as JSON, or as it is when it is already text or bytes."""
        path = self.remote / name
        if isinstance(record, bytes):
            path.write_bytes(record)
        else:
            path.write_text(record if isinstance(record, str) else json.dumps(record))
        readable(path)


def readable(path: Path) -> None:
    """Readable by the server's login user (as root the tests log in as another user)."""
    path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def setup(cluster, tmp_path):
    return fetched_once(cluster, tmp_path)


@pytest.fixture(scope="module")
def shared_setup(cluster, tmp_path_factory):
    """One setup for the hostile records: each is refused and changes nothing (assert_held), so the next finds
    the same state, and the good fetch before them is made once."""
    return fetched_once(cluster, tmp_path_factory.mktemp("records"))


def fetched_once(cluster: Cluster, tmp_path: Path) -> Setup:
    """A cluster capture, a workstation that fetched it once, and a victim file beside it."""
    cluster_workdir = cluster.base / tmp_path.name
    remote = cluster_workdir / CAPTURE
    remote.mkdir(parents=True)
    (remote / "profile.nsys-rep").write_bytes(os.urandom(10_000))
    (remote / "profile.rank0.metrics.jsonl").write_text('{"step": 1, "step_time_s": 0.1}\n')
    for path in [cluster_workdir, *cluster_workdir.rglob("*")]:
        readable(path)
    workdir, outside = tmp_path / "workstation", tmp_path / "outside"
    workdir.mkdir()
    outside.mkdir()
    (outside / "victim.txt").write_text("precious\n")
    (tmp_path / "victim.txt").write_text("precious too\n")
    config = {
        **SMALL_DEMO,
        "results_from": "remote",
        "remote": {
            "host": "127.0.0.1",
            "port": cluster.server.port,
            "user": cluster.user,
            "identity_file": str(cluster.key),
            "ssh_config": str(cluster.ssh_config),
            "known_hosts": str(cluster.known_hosts),
            "use_agent": False,
            "timeout_s": 10,
            "retries": 0,
            "workdir": str(cluster_workdir),
        },
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    result = Setup(remote, workdir, outside)
    result.write_record(GOOD_RECORD)
    first = result.fetch()
    assert first.returncode == 0, first.stderr
    assert (workdir / CAPTURE / "profile.nsys-rep").read_bytes() == (remote / "profile.nsys-rep").read_bytes()
    return result


def assert_held(setup: Setup, tmp_path: Path, message: str = "") -> None:
    """The fetch was refused in one line; the last good capture and everything outside the
    workflow folder are as they were."""
    before_capture = tree_state(setup.workdir / CAPTURE)
    before_outside = {name: state for name, state in tree_state(tmp_path).items() if not name.startswith("workstation")}
    assert_refused(setup.fetch(), contains=message)
    assert tree_state(setup.workdir / CAPTURE) == before_capture
    assert {
        name: state for name, state in tree_state(tmp_path).items() if not name.startswith("workstation")
    } == before_outside


# Each case is a record the cluster might serve instead of the good one, with the message's gist.
HOSTILE_RECORDS = {
    "report climbing out": ({**GOOD_RECORD, "report": "../../../../../victim.txt"}, "not a plain file name"),
    "report as absolute path": ({**GOOD_RECORD, "report": "{outside}/victim.txt"}, "not a plain file name"),
    "report as home path": ({**GOOD_RECORD, "report": "~/.ssh/authorized_keys"}, "not a plain file name"),
    "report with a newline": ({**GOOD_RECORD, "report": "profile\n.nsys-rep"}, "not a plain file name"),
    "report with an escape": ({**GOOD_RECORD, "report": "profile\x1b[2J.nsys-rep"}, "not a plain file name"),
    "hidden report": ({**GOOD_RECORD, "report": ".profile.nsys-rep.part"}, "not a plain file name"),
    "report as option": ({**GOOD_RECORD, "report": "-rf"}, "not a plain file name"),
    "report as number": ({**GOOD_RECORD, "report": 7}, "expected a file name"),
    "report too long": ({**GOOD_RECORD, "report": "p" * 300}, "not a plain file name"),
    "rank as path": ({**GOOD_RECORD, "rank": "/../../../rankx"}, "rank"),
    "rank as text": ({**GOOD_RECORD, "rank": "0"}, "rank"),
    "rank as boolean": ({**GOOD_RECORD, "rank": True}, "rank"),
    "negative rank": ({**GOOD_RECORD, "rank": -1}, "rank"),
    "huge rank": ({**GOOD_RECORD, "rank": 10**30}, "rank"),
    "float rank": ({**GOOD_RECORD, "rank": 0.5}, "rank"),
    "job id as glob": ({**GOOD_RECORD, "slurm_job_id": "*"}, "slurm_job_id"),
    "job id climbing out": ({**GOOD_RECORD, "slurm_job_id": "1/../../x"}, "slurm_job_id"),
    "host with escape": ({**GOOD_RECORD, "host": "n\x1b]0;pwned\x07"}, "host"),
    "missing fields": ({"report": "profile.nsys-rep"}, "rank"),
    "not json": ("{rank: 0", "is not a rank record"),
    "json list": ("[0, 1]", "is not a rank record"),
    "deep nesting": ("[" * 100_000 + "]" * 100_000, "is not a rank record"),
    "huge record": (json.dumps({**GOOD_RECORD, "pad": "x" * (2 << 20)}), "more than the 1,048,576 it may hold"),
    "not utf-8": (b'{"rank": "\xff"}', "is not a rank record"),
}


@pytest.mark.ci_sample(12)
@pytest.mark.parametrize("case", list(HOSTILE_RECORDS))
def test_a_hostile_record_is_refused_and_writes_nothing(shared_setup, case):
    setup = shared_setup
    record, message = HOSTILE_RECORDS[case]
    if isinstance(record, dict) and isinstance(record.get("report"), str):
        record = {**record, "report": record["report"].format(outside=setup.outside)}
        # Serve the file the record names where the server can, so only sftprof's check stops it.
        target = Path(os.path.normpath(setup.remote / record["report"]))
        try:
            if target.parent.is_dir() and not target.exists():
                target.write_text("hostile\n")
                readable(target)
        except OSError:  # a name no file system takes
            pass
    setup.write_record(record)
    assert_held(setup, setup.workdir.parent, message)  # the folder beside the workstation, shared by the records


def test_a_remote_file_name_with_a_newline_is_refused(setup, tmp_path):
    setup.write_record(GOOD_RECORD, name="rank\n1.json")
    assert_held(setup, tmp_path, "not a plain file name")


def test_a_remote_report_that_is_a_symbolic_link_is_not_followed(setup, tmp_path, cluster):
    secret = cluster.base / f"{tmp_path.name}-secret"
    secret.write_text("the cluster user's secret\n")
    readable(secret)
    (setup.remote / "profile.nsys-rep").unlink()
    (setup.remote / "profile.nsys-rep").symlink_to(secret)
    assert_held(setup, tmp_path, "a symbolic link, not followed")


def test_a_remote_record_that_is_a_symbolic_link_is_not_read(setup, tmp_path, cluster):
    (setup.remote / "rank0.json").unlink()
    (setup.remote / "rank0.json").symlink_to(cluster.base / "authorized_keys")
    assert_held(setup, tmp_path, "no rank records")


def test_a_link_planted_at_the_partial_download_is_not_written_through(setup, tmp_path):
    (setup.remote / "profile.nsys-rep").write_bytes(os.urandom(20_000))  # a new report: it must be downloaded
    partial = setup.workdir / STAGING / ".profile.nsys-rep.part"
    partial.symlink_to(tmp_path / "victim.txt")
    assert_held(setup, tmp_path, "is a symbolic link; not writing through it")


@pytest.mark.parametrize("change", ["shrinks", "grows"])
def test_a_remote_file_that_changes_during_transfer_never_passes_for_complete(cluster, setup, tmp_path, change):
    source = setup.remote / "changing.bin"
    original = os.urandom(40 << 20)
    source.write_bytes(original)
    readable(source)
    changed = []

    def mutate(position: int, size: int) -> None:
        if not changed:
            changed.append(position)
            with open(source, "r+b") as remote_file:
                remote_file.truncate(size // 4) if change == "shrinks" else remote_file.seek(0, os.SEEK_END)
                if change == "grows":
                    remote_file.write(os.urandom(1 << 20))

    target = setup.workdir / "changing.bin"
    remote = transfer.Remote(
        "127.0.0.1",
        port=cluster.server.port,
        user=cluster.user,
        identity_file=cluster.key,
        ssh_config=cluster.ssh_config,
        known_hosts=cluster.known_hosts,
        use_agent=False,
        timeout_s=10,
    )
    try:
        transfer.fetch(remote, str(source), target, retries=0, progress=mutate)
    except transfer.TransferError as error:
        assert "shrank" in str(error) or "checksum mismatch" in str(error)
        assert not target.exists()
    else:  # the server hashed the file before it grew: the copy is the file as it was
        assert change == "grows" and target.read_bytes() == original
    assert changed
