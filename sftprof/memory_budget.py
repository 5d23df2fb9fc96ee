"""The memory an analysis aims to stay under (`sftprof analyze --memory-budget`, the workflow's
`memory_budget`). Each DuckDB database the analysis opens is held to a share of it; what the
process peaked at is compared with it when an analysis ends, and a run that went over says so,
since what the analyses hold in numpy and pandas beside the store (windows of rows; the waits and
copies joined to their calls, which grow with the capture) does not obey it (benchmarks/ENGINE.md,
sections 11 and 16)."""

from __future__ import annotations

import ctypes
import re
import resource
import threading

from sftprof.errors import SftprofError

DEFAULT = "1GB"
# Loading keeps two databases open (the export's reader and the event store), the analysis a
# summary's beside the store: three shares at most. 128 MB each at 1 GB cost no time at 10M
# kernels against 512 MB (benchmarks/ENGINE.md).
DUCKDB_SHARE = 8
MIN_DUCKDB_BYTES = 64 * 2**20  # a 1M-kernel copy ran out at 16 MiB, not at 32 (benchmarks/ENGINE.md)
# DuckDB's share a thread: each thread aggregates and sorts in memory of its own. With 8 threads in 128 MiB
# (the GPU machine's 16 cores), the exact median's histogram over NeMo's 60M NVTX ranges ran out; with 4 it
# did not (benchmarks/ENGINE.md). Its 2^21 groups were the cause, and with other values 4 threads ran out too:
# DUCKDB_GROUPS below now bounds them (section 24).
DUCKDB_THREAD_BYTES = 32 * 2**20
# The most groups a GROUP BY over rows that grow with the capture may make. Up to about there each DuckDB thread
# aggregates into a table of its own whose size does not grow with the rows; beyond it the rows themselves are
# partitioned and held, so memory grows with them: counting 30M-120M random values into 2^15 buckets ran out of
# a 128 MiB share with 4 or 8 threads, on the development VM and on the GPU machine alike, and 2^14 did not
# (benchmarks/ENGINE.md). On NeMo's 12M NVTX ranges the median's 2^21 buckets ran out on any machine of 4 cores or more.
DUCKDB_GROUPS = 1 << 14
MAX_BYTES = 2**50  # 1 PB: more than any machine has, and far from float and DuckDB limits
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r" *(\d+(?:\.\d+)?) *([KMGT]?)(?:I?B)? *\Z", re.IGNORECASE)


class MemoryBudgetError(SftprofError, ValueError):
    """A memory budget that is not a size."""


def parse(text: str) -> int:
    """Bytes from "1GB", "1.5G", "512MiB", "800M" (binary units: 1 GB is 2^30 bytes, as RSS is reported)."""
    match = _SIZE.match(str(text))
    if not match:
        raise MemoryBudgetError(f"memory budget {text!r} is not a size such as 1GB, 1.5G or 512MB")
    size = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if size > MAX_BYTES:
        raise MemoryBudgetError(f"memory budget {text!r} is beyond {MAX_BYTES // 2**40}TB")
    if size < MIN_DUCKDB_BYTES * DUCKDB_SHARE:
        raise MemoryBudgetError(f"memory budget {text!r} is below {MIN_DUCKDB_BYTES * DUCKDB_SHARE // 2**20}MB")
    return int(size)


# glibc's malloc gives threads that contend for it heaps (arenas) of their own, up to 8 a core, and each keeps
# what is freed into it for its own thread: on the GPU machine's 16 cores NeMo's 10M export peaked at 1.26 and 1.19
# GiB with glibc's default, 1.08 and 1.10 with 2 arenas, alternating in one call, in the same time (43.3 and 40.1 s
# against 47.8 and 38.5). A fixed 4 MiB mmap threshold on top took no more off (1.10-1.11) and 10% more time, and
# 1 MiB took 2.4x the time where threads outnumber cores (benchmarks/ENGINE.md).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h


def _fewer_malloc_arenas() -> None:
    """Hold the threads started from now on to MALLOC_ARENAS heaps; nothing where the C library has no mallopt
    (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


# Under an address-space limit (ulimit -v, as many clusters set), what the process maps counts, not what it uses:
# each thread's stack reserves RLIMIT_STACK (8 MiB by default), and a 1 MB capture's analysis mapped 1.09 GB with
# 0.30 GB resident; with THREAD_STACK_BYTES stacks it mapped 0.76 GB and ran under a limit of 0.78 GB, not 0.73.
# ADDRESS_OVERHEAD is the libraries' share of that (numba's LLVM, pandas, DuckDB and its sqlite extension), the
# budget's the rest: a limit below their sum is refused before any work.
THREAD_STACK_BYTES = 2 * 2**20
ADDRESS_OVERHEAD = 768 * 2**20


def _smaller_thread_stacks() -> None:
    """THREAD_STACK_BYTES stacks for the threads started from now on (Python's, and DuckDB's through glibc's
    default thread attributes); nothing where the C library cannot set them (not glibc)."""
    threading.stack_size(THREAD_STACK_BYTES)
    try:
        libc = ctypes.CDLL(None)
        attr = ctypes.create_string_buffer(256)  # larger than any pthread_attr_t
        if libc.pthread_attr_init(attr) == 0:
            libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(THREAD_STACK_BYTES))
            libc.pthread_setattr_default_np(attr)
            libc.pthread_attr_destroy(attr)
    except (OSError, AttributeError):
        return


def _fit_address_space(size: int) -> None:
    """Where the address space is limited, threads with smaller stacks, and a limit too small for the budget
    refused in one line rather than left to abort a thread start deep in DuckDB."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return
    _smaller_thread_stacks()
    if limit < size + ADDRESS_OVERHEAD:
        raise MemoryBudgetError(
            f"the address-space limit (ulimit -v) of {limit / 2**30:.2f} GB is below the "
            f"{(size + ADDRESS_OVERHEAD) / 2**30:.2f} GB an analysis may map: the memory budget of "
            f"{size / 2**30:.2f} GB and {ADDRESS_OVERHEAD // 2**20} MB of libraries; raise the limit, or lower "
            f"--memory-budget (memory_budget in the workflow's config; {MIN_DUCKDB_BYTES * DUCKDB_SHARE // 2**20}MB "
            "at least)"
        )


_budget = parse(DEFAULT)


def use(size: int) -> None:
    """Set the budget (bytes) for the databases opened from now on in this process, and malloc's heaps and the
    threads' stacks for what the analyses hold beside them (before the analyses start their threads)."""
    global _budget
    _fit_address_space(size)
    _budget = size
    _fewer_malloc_arenas()


def current() -> int:
    return _budget


def _duckdb_bytes() -> int:
    return max(_budget // DUCKDB_SHARE, MIN_DUCKDB_BYTES)


def duckdb_limit() -> str:
    """DuckDB's memory_limit setting for one database."""
    return f"{_duckdb_bytes() // 2**20}MiB"


def duckdb_threads(cores: int) -> int:
    """DuckDB's threads for one database: `cores`, or as many as its share of the budget holds."""
    return max(1, min(cores, _duckdb_bytes() // DUCKDB_THREAD_BYTES))


# A share's bytes for each group one GROUP BY of a summary (SQL_AGGREGATES) makes: DuckDB does not spill such an
# aggregate. Over 6M NVTX names (one for each range) it ran out of 128 MiB with 3M groups a query; with 512k it
# ran out at times, beside other sections' queries; 128k a query took 2.8 s in all, 750k 2.2 s.
SUMMARY_GROUP_BYTES = 1024


def summary_groups() -> int:
    """The most groups of a summary one query makes (stats.grouped_summary): 128k at the default budget."""
    return _duckdb_bytes() // SUMMARY_GROUP_BYTES


def exceeded(error: Exception) -> MemoryBudgetError:
    """The error for DuckDB's out-of-memory error: its share of the budget was too small for a query."""
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    return MemoryBudgetError(
        f"DuckDB needed more than its {duckdb_limit()} share of the {_budget / 2**30:.2f} GB memory budget "
        f"({detail}): raise --memory-budget (memory_budget in the workflow's config)"
    )


def peak() -> int:
    """This process's peak resident memory so far, in bytes (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def overrun() -> str | None:
    """A line saying by how much the process went over the budget; None while it has not."""
    used = peak()
    if used <= _budget:
        return None
    return (
        f"peak memory {used / 2**30:.2f} GB went over the memory budget of {_budget / 2**30:.2f} GB: "
        "what the analyses hold beside the database (windows of about 1M rows, tables per step and per name) is "
        "not held to it, and analyses run side by side (docs/USAGE.md, Memory)"
    )
