"""Results that live on the cluster: which remote files make a window's capture or report, and
fetching them into this machine's results/ tree through sftprof.capture.transfer.

A capture is fetched record first: each rank's record names its report, so only the reports
of the run that finished last are fetched, even when earlier jobs left theirs in the same
folder. Files land in a staging folder outside Snakemake's outputs (a failed job must not
delete the `.part` files that the next try resumes) and are linked into the capture folder
only when every one of them is verified.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
from pathlib import Path

from sftprof import layout
from sftprof.capture import rank, transfer
from sftprof.io import atomic_dir
from sftprof.untrusted import plain_file_name

log = logging.getLogger(__name__)


def connection(remote: dict, trust_new_host: bool = False) -> transfer.Remote:
    """transfer.Remote from the config's `remote` section (trusting a new host is never a
    config setting: only `sftprof fetch --trust-new-host` passes it)."""
    return transfer.Remote(
        host=remote["host"],
        port=remote.get("port"),
        user=remote.get("user"),
        identity_file=remote.get("identity_file"),
        ssh_config=remote.get("ssh_config"),
        known_hosts=remote.get("known_hosts"),
        use_agent=remote["use_agent"],
        timeout_s=remote["timeout_s"],
        trust_new_host=trust_new_host,
    )


def remote_path(remote: dict, relative: str) -> str:
    """The cluster-side path of a workflow file: same layout, under the cluster's workdir."""
    return posixpath.join(remote["workdir"], relative)


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, target)


def _job_logs(session: transfer.Session, remote: dict, names: dict, job_ids: set) -> list[str]:
    """The logs of the run the records come from, where they exist: the workflow's profile log,
    and Slurm's output of a job submitted with `sftprof submit`."""
    profile_log = layout.PROFILE_LOG.format(**names)
    candidates = [
        (posixpath.dirname(profile_log), posixpath.basename(profile_log)),
        *[(layout.JOB_DIR.format(**names), f"slurm-{job_id}.out") for job_id in job_ids if job_id],
    ]
    found = []
    for folder, pattern in candidates:
        try:
            found += session.list_files(remote_path(remote, folder), pattern)
        except transfer.RemoteNotFound:
            pass  # that route was not taken on the cluster
    return found


def _fetch_into(
    session: transfer.Session, paths: list[str], staging: Path, where: str, progress: bool
) -> list[transfer.FetchResult]:
    """Fetch remote `paths` into `staging` under their own names, each checked before any is written."""
    local = [staging / plain_file_name(posixpath.basename(path), where) for path in paths]
    return [session.fetch(path, target, progress=progress) for path, target in zip(paths, local)]


def fetch_capture(
    remote: dict,
    experiment_name: str,
    experiment: dict,
    window_name: str,
    capture_dir: str | Path,
    *,
    trust_new_host: bool = False,
    progress: bool = True,
) -> list[transfer.FetchResult]:
    """Fetch one window's capture (records, reports, metrics of every rank, and the run's logs)
    into `capture_dir`."""
    names = {"experiment": experiment_name, "window": window_name}
    source = remote_path(remote, layout.CAPTURE_DIR.format(**names))
    staging = Path(layout.FETCH_STAGING.format(**names))
    staging.mkdir(parents=True, exist_ok=True)
    metrics = rank.METRICS_PATTERN.format(output_name=experiment["profile"]["output_name"])
    with transfer.Session(connection(remote, trust_new_host), retries=remote["retries"]) as session:
        record_paths = session.list_files(source, rank.RECORD_GLOB)
        if not record_paths:
            raise transfer.TransferError(
                f"no rank records in {remote['host']}:{source}: has this window run on the cluster yet?"
            )
        where = f"{remote['host']}:{source}"
        fetched = _fetch_into(session, record_paths, staging, where, progress)
        job_ids = set()
        for result in list(fetched):
            record = rank.read_record(result.local_path)
            job_ids.add(record["slurm_job_id"])
            wanted = [metrics.format(rank=record["rank"])] + ([record["report"]] if record["report"] else [])
            fetched += _fetch_into(session, [posixpath.join(source, name) for name in wanted], staging, where, progress)
        fetched += _fetch_into(session, _job_logs(session, remote, names, job_ids), staging, where, False)
    with atomic_dir(capture_dir) as partial:
        for result in fetched:
            _link_or_copy(result.local_path, partial / result.local_path.name)
    moved = sum(result.bytes_transferred for result in fetched)
    log.info("fetched %d files of %s (%d bytes transferred)", len(fetched), source, moved)
    return fetched


def fetch_report(
    remote: dict, experiment_name: str, window_name: str, html_path: str | Path, *, trust_new_host: bool = False
) -> transfer.FetchResult:
    """Fetch the report.html that the cluster's own run of the workflow rendered."""
    source = remote_path(remote, layout.REPORT_HTML.format(experiment=experiment_name, window=window_name))
    with transfer.Session(connection(remote, trust_new_host), retries=remote["retries"]) as session:
        return session.fetch(source, html_path, progress=False)
