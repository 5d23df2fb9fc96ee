"""Load a PyTorch profiler (Kineto) Chrome trace, `.json` or `.json.gz`, into TraceTables.

`torch.profiler` writes these with `prof.export_chrome_trace(PATH)` or
`tensorboard_trace_handler(DIR)`. Every timed event is a Chrome-trace "X" event whose `cat`
says what it is (libkineto's ChromeTraceLogger); this loader maps them onto the nsys tables:

  user_annotation   record_function ranges ("step 3", "forward")  -> nvtx (PushPop ranges)
  cpu_op            ATen operators ("aten::mm")                   -> nvtx as well: nsys records
                    the same operators as NVTX ranges under torch.autograd.profiler.emit_nvtx
  cuda_runtime,
  cuda_driver       CUDA API calls on the host                    -> cuda_api
  kernel            GPU kernels (pid = device, tid = stream)      -> kernels
  gpu_memcpy,
  gpu_memset        GPU memory operations                         -> memops
  ph "M" thread_name / process_name metadata of host processes   -> threads

Left out on purpose: gpu_user_annotation (record_function ranges replayed on the GPU
timeline: they would count every step twice), python_function (with_stack frames), flows and
profiler bookkeeping. OS-runtime calls do not exist in Kineto traces, so `osrt` stays empty.

Times: Kineto writes microseconds with three decimals, relative to `baseTimeNanoseconds` in
recent versions and absolute in older ones (19 significant digits). They are parsed as
decimals, not floats, so nanoseconds survive and ranges nested in the trace stay nested.

Hostile or damaged files: the JSON read is capped (MAX_JSON_BYTES, decompressed) and its nesting
bounded by Python's parser (RecursionError is refused); an event of a mapped category whose time
is not a finite number, whose pid or tid is not a 24-bit integer, or whose name is not a string is
left out and counted in TraceTables.dropped_rows, as are rows whose times are not valid
(events.valid_times); fields in `args` of the wrong type are read as unknown.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from sftprof.trace.events import MAX_TIME_NS, EventStore
from sftprof.trace.nsys.nsys_export import TraceFormatError, require_file
from sftprof.trace.nsys.nsys_sqlite import MEMCPY_OPERATIONS, MEMSET_OPERATION
from sftprof.trace.tables import COLUMNS, TraceTables, empty, gpu_rows, valid_rows

HOST_RANGE_CATEGORIES = {"user_annotation", "cpu_op"}
CUDA_API_CATEGORIES = {"cuda_runtime", "cuda_driver"}
KERNEL_CATEGORY = "kernel"
MEMCPY_CATEGORY, MEMSET_CATEGORY = "gpu_memcpy", "gpu_memset"
# Categories whose `pid` is a GPU index, not a host process.
DEVICE_CATEGORIES = {KERNEL_CATEGORY, MEMCPY_CATEGORY, MEMSET_CATEGORY, "gpu_user_annotation"}
KNOWN_CATEGORIES = HOST_RANGE_CATEGORIES | CUDA_API_CATEGORIES | DEVICE_CATEGORIES

# Kineto names memcpys "Memcpy HtoD (Pageable -> Device)"; nsys names them "[CUDA memcpy HtoD]".
KINETO_MEMCPY_NAME = re.compile(r"^Memcpy (\w+)")
NSYS_MEMCPY_BY_KIND = {
    name.removeprefix("[CUDA memcpy ").removesuffix("]"): name for name in MEMCPY_OPERATIONS.values()
}
UNKNOWN_MEMCPY = NSYS_MEMCPY_BY_KIND["Unknown"]
# Kineto names host threads "thread <tid> (<name>)"; nsys knows them by <name> alone.
KINETO_THREAD_NAME = re.compile(r"^thread \d+ \((.*)\)$")
API_VERSION_SUFFIX = re.compile(r"_v\d+$")
TID_BITS = 24  # global_tid = pid << 24 | tid, the layout nsys uses: a pid or tid is an integer in [0, 2^24)
# Parsed, a Kineto trace takes about 3.5 times its JSON's size in memory (4.5 at the peak): 1 GiB of
# JSON is about 5 GB. Larger JSON, or a gzip bomb, is refused once this much has been read.
MAX_JSON_BYTES = 1 << 30
READ_BYTES = 16 << 20  # read (and decompressed) at a time, so a bomb never inflates past the cap
# Older Kineto writes epoch microseconds (about 2^60.6 ns): a time beyond ±2^62 ns is no clock's.
MAX_ABSOLUTE_US = Decimal(2**62) / 1000


def kernel_short_name(name: str) -> str:
    """The function name alone, as nsys's `shortName`: "void at::native::foo<4, ...>(int, ...)" -> "foo".

    Drops every bracketed group (template arguments, parameter lists, "(anonymous namespace)"),
    then the return type and namespaces."""
    skeleton, depth = [], 0
    for char in name:
        if char in "<(":
            depth += 1
        elif char in ">)" and depth:
            depth -= 1
        elif not depth:
            skeleton.append(char)
    words = "".join(skeleton).split()
    if not words:
        return name
    parts = [part for part in words[-1].split("::") if part]
    return parts[-1] if parts else name


def _read_json(path: Path):
    require_file(path)
    try:
        with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as stream:
            data = bytearray()
            while chunk := stream.read(READ_BYTES):
                data += chunk
                if len(data) > MAX_JSON_BYTES:
                    raise TraceFormatError(
                        f"{path}: more than {MAX_JSON_BYTES / 2**30:g} GiB of JSON (decompressed): "
                        "too large to load, or a decompression bomb"
                    )
        text = data.decode("utf-8")
        del data
        return json.loads(text, parse_float=Decimal)
    except TraceFormatError:  # the cap's, a ValueError too
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFormatError(f"{path}: damaged or truncated gzip file ({exc or 'unexpected end of data'})") from None
    except UnicodeDecodeError:
        raise TraceFormatError(f"{path}: not a text (JSON) file") from None
    except RecursionError:
        raise TraceFormatError(f"{path}: JSON nested too deeply to be a trace") from None
    except ValueError as exc:  # json.JSONDecodeError, and integers of more than 4300 digits
        raise TraceFormatError(f"{path}: not valid JSON, or cut short ({exc})") from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _category(event: dict) -> str | None:
    category = event.get("cat")
    return category if isinstance(category, str) else None


def _trace_events(path: Path) -> tuple[list[dict], object]:
    """The trace's events (the dicts among them) and the whole document."""
    document = _read_json(path)
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise TraceFormatError(f"{path}: JSON, but not a Chrome trace (no traceEvents list)")
    events = [event for event in events if isinstance(event, dict)]
    is_kineto = isinstance(document, dict) and "schemaVersion" in document
    if not is_kineto and not any(_category(event) in KNOWN_CATEGORIES for event in events):
        raise TraceFormatError(
            f"{path}: a Chrome trace, but not one written by the PyTorch profiler (no Kineto events)"
        )
    return events, document


def _ns(microseconds) -> int | None:
    """A JSON time in microseconds as integer nanoseconds; None unless a finite number within
    ±MAX_ABSOLUTE_US (json gives Infinity as a float and 1e999 as a Decimal: refused before any arithmetic)."""
    if isinstance(microseconds, bool) or not isinstance(microseconds, (int, float, Decimal)):
        return None
    value = Decimal(microseconds)
    if not value.is_finite() or value.copy_abs() > MAX_ABSOLUTE_US:  # copy_abs: no context, no overflow
        return None
    return int(value * 1000)


def _times(event: dict) -> tuple[int, int] | None:
    """(start, end) in absolute nanoseconds, or None for an event that is not timed or whose ts or dur is no time."""
    if event.get("ph") == "M":
        return None
    start, duration = _ns(event.get("ts")), _ns(event.get("dur", 0))
    return None if start is None or duration is None else (start, start + duration)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(value, low: int, high: int) -> int | None:
    return value if _is_int(value) and low <= value < high else None


def _id(value) -> int | None:
    """A pid or tid as global_tid can hold it."""
    return _int_in(value, 0, 1 << TID_BITS)


def _id_number(value) -> int | None:
    """A correlation id or a byte count: a non-negative int64."""
    return _int_in(value, 0, 1 << 63)


def _args(event: dict) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _host_ids(event: dict) -> dict:
    pid, tid = event["pid"], event["tid"]
    return {"global_tid": (pid << TID_BITS) | tid, "pid": pid, "tid": tid}


def _table(
    events: list[dict], categories: set[str], table: str, origin: int, dropped: dict[str, int], row
) -> pd.DataFrame:
    """`table` from the complete ("X") events of `categories`: `row(event, name)` gives each one's columns
    besides its times, or None when a field it needs has the wrong type. Such events, and rows whose times
    are not valid, are left out and counted in `dropped`."""
    rows, malformed = [], 0
    for e in events:
        if e.get("ph") != "X" or _category(e) not in categories:
            continue
        times, name = _times(e), e.get("name", "")
        columns = (
            row(e, name)
            if times and _id(e.get("pid")) is not None and _id(e.get("tid")) is not None and isinstance(name, str)
            else None
        )
        if columns is None:
            malformed += 1
            continue
        rows.append({"start": times[0] - origin, "end": times[1] - origin, **columns})
    if malformed:
        dropped[table] = malformed
    if not rows:
        return empty(table)
    frame = valid_rows(pd.DataFrame(rows, columns=COLUMNS[table]), table, dropped)
    return frame.sort_values("start", kind="stable").reset_index(drop=True)


def _nvtx(events: list[dict], origin: int, dropped: dict[str, int]) -> pd.DataFrame:
    return _table(
        events,
        HOST_RANGE_CATEGORIES,
        "nvtx",
        origin,
        dropped,
        lambda e, name: {"name": name, "style": "PushPop", **_host_ids(e)},
    )


def _cuda_api(events: list[dict], origin: int, dropped: dict[str, int]) -> pd.DataFrame:
    return _table(
        events,
        CUDA_API_CATEGORIES,
        "cuda_api",
        origin,
        dropped,
        lambda e, name: {
            "name": API_VERSION_SUFFIX.sub("", name),
            **_host_ids(e),
            "correlation_id": _id_number(_args(e).get("correlation")),
        },
    )


def _launch_shape(values) -> str | None:
    """[x, y, z] as nsys stats prints a grid or block: "%4d %4d %4d"."""
    if not isinstance(values, list) or len(values) != 3 or any(_int_in(v, 0, 1 << 31) is None for v in values):
        return None
    return "{:4d} {:4d} {:4d}".format(*values)


def _device_common(event: dict, launching_pid: dict[int, int], only_host_pid: int | None) -> dict:
    args = _args(event)
    correlation = _id_number(args.get("correlation"))
    device = _id(args.get("device", args.get("inDevice")))
    stream = _id(args.get("stream"))
    return {
        "device_id": event["pid"] if device is None else device,
        "stream_id": event["tid"] if stream is None else stream,
        "pid": launching_pid.get(correlation, only_host_pid),
        "correlation_id": correlation,
    }


def _kernels(events, origin, launching_pid, only_host_pid, dropped) -> pd.DataFrame:
    def row(e, name):
        args = _args(e)
        return {
            "name": name,
            "short_name": kernel_short_name(name),
            "mangled_name": None,
            **_device_common(e, launching_pid, only_host_pid),
            "grid": _launch_shape(args.get("grid")),
            "block": _launch_shape(args.get("block")),
        }

    return _table(events, {KERNEL_CATEGORY}, "kernels", origin, dropped, row)


def _memop_operation(event: dict, name: str) -> str:
    if event["cat"] == MEMSET_CATEGORY:
        return MEMSET_OPERATION
    kind = KINETO_MEMCPY_NAME.match(name)
    return NSYS_MEMCPY_BY_KIND.get(kind.group(1), UNKNOWN_MEMCPY) if kind else UNKNOWN_MEMCPY


def _memops(events, origin, launching_pid, only_host_pid, dropped) -> pd.DataFrame:
    def row(e, name):
        size = _id_number(_args(e).get("bytes"))  # what every memory analysis reads: not optional
        return (
            None
            if size is None
            else {
                "operation": _memop_operation(e, name),
                "bytes": size,
                **_device_common(e, launching_pid, only_host_pid),
            }
        )

    return _table(events, {MEMCPY_CATEGORY, MEMSET_CATEGORY}, "memops", origin, dropped, row)


def _threads(events: list[dict], device_pids: set[int]) -> pd.DataFrame:
    process_names, thread_names = {}, {}
    for e in events:
        pid, name = _id(e.get("pid")), _args(e).get("name", "")
        if e.get("ph") != "M" or pid is None or pid in device_pids or not isinstance(name, str):
            continue
        if e.get("name") == "process_name":
            process_names[pid] = name
        elif e.get("name") == "thread_name" and _id(e.get("tid")) is not None:
            kineto_name = KINETO_THREAD_NAME.match(name)
            thread_names[(pid, e["tid"])] = kineto_name.group(1) if kineto_name else name
    rows = [
        {
            "global_tid": (pid << TID_BITS) | tid,
            "pid": pid,
            "tid": tid,
            "thread_name": name,
            "process_name": process_names.get(pid),
        }
        for (pid, tid), name in sorted(thread_names.items())
    ]
    return pd.DataFrame(rows, columns=COLUMNS["threads"]) if rows else empty("threads")


# deviceProperties key -> gpus column (libkineto's CuptiActivityProfiler devicePropertiesJson).
DEVICE_PROPERTIES = {"id": "device_id", "name": "name", "numSms": "sm_count", "totalGlobalMem": "memory_bytes"}


def _gpus(document) -> pd.DataFrame:
    """The GPUs of the trace's `deviceProperties` (Kineto writes it when CUDA was profiled; empty or
    absent for a CPU trace): id, name, SMs, memory, compute capability. A value of the wrong type is NA."""
    properties = document.get("deviceProperties") if isinstance(document, dict) else None
    if not isinstance(properties, list):
        return empty("gpus")
    rows = []
    for device in properties:
        if not isinstance(device, dict):
            continue
        row = {column: device.get(key) for key, column in DEVICE_PROPERTIES.items()}
        major, minor = (_int_in(device.get(key), 0, 100) for key in ("computeMajor", "computeMinor"))
        row["compute_capability"] = f"{major}.{minor}" if major is not None and minor is not None else None
        rows.append(
            {column: value if _is_int(value) or isinstance(value, str) else None for column, value in row.items()}
        )
    return gpu_rows(pd.DataFrame(rows, columns=[*DEVICE_PROPERTIES.values(), "compute_capability"]))


def load_kineto_json(path: str | Path) -> TraceTables:
    path = Path(path)
    events, document = _trace_events(path)
    spans = [times for times in map(_times, events) if times is not None]
    starts = np.array([start for start, _ in spans] or [0], dtype=np.int64)
    # The first event near the median: a capture's events lie within MAX_TIME_NS of each other, and one
    # far-off time (damaged) must not move the origin of all the others out of range.
    origin = int(starts[np.abs(starts - np.median(starts)) <= MAX_TIME_NS].min())
    # The capture's span over the events a capture can hold (valid_rows leaves the others out of every table).
    span_ns = max((end for start, end in spans if start <= end <= origin + MAX_TIME_NS), default=origin) - origin

    dropped: dict[str, int] = {}
    nvtx = _nvtx(events, origin, dropped)
    cuda_api = _cuda_api(events, origin, dropped)
    launches = cuda_api[cuda_api["correlation_id"].notna()]
    launching_pid = dict(zip(launches["correlation_id"], launches["pid"]))
    host_pids = set(nvtx["pid"]) | set(cuda_api["pid"])
    only_host_pid = next(iter(host_pids)) if len(host_pids) == 1 else None
    kernels = _kernels(events, origin, launching_pid, only_host_pid, dropped)
    memops = _memops(events, origin, launching_pid, only_host_pid, dropped)
    device_pids = {e["pid"] for e in events if _category(e) in DEVICE_CATEGORIES and _id(e.get("pid")) is not None}

    sources = set()
    if not nvtx.empty:
        sources.add("nvtx")
    if not (cuda_api.empty and kernels.empty and memops.empty):
        sources.add("cuda")
    return TraceTables(
        source_path=str(path),
        span_ns=span_ns,
        sources=sources,
        threads=_threads(events, device_pids - host_pids),
        gpus=_gpus(document),
        events=EventStore.from_frames(kernels, cuda_api, nvtx=nvtx, memops=memops),
        dropped_rows=dropped,
    )
