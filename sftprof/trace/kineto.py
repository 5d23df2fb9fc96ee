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
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from decimal import Decimal
from pathlib import Path

import pandas as pd

from sftprof.trace.events import EventStore
from sftprof.trace.nsys_sqlite import MEMCPY_OPERATIONS, MEMSET_OPERATION, TraceFormatError
from sftprof.trace.tables import COLUMNS, TraceTables, empty

HOST_RANGE_CATEGORIES = {"user_annotation", "cpu_op"}
CUDA_API_CATEGORIES = {"cuda_runtime", "cuda_driver"}
KERNEL_CATEGORY = "kernel"
MEMCPY_CATEGORY, MEMSET_CATEGORY = "gpu_memcpy", "gpu_memset"
# Categories whose `pid` is a GPU index, not a host process.
DEVICE_CATEGORIES = {KERNEL_CATEGORY, MEMCPY_CATEGORY, MEMSET_CATEGORY, "gpu_user_annotation"}
KNOWN_CATEGORIES = HOST_RANGE_CATEGORIES | CUDA_API_CATEGORIES | DEVICE_CATEGORIES

# Kineto names memcpys "Memcpy HtoD (Pageable -> Device)"; nsys names them "[CUDA memcpy HtoD]".
KINETO_MEMCPY_NAME = re.compile(r"^Memcpy (\w+)")
NSYS_MEMCPY_BY_KIND = {name.removeprefix("[CUDA memcpy ").removesuffix("]"): name
                       for name in MEMCPY_OPERATIONS.values()}
UNKNOWN_MEMCPY = NSYS_MEMCPY_BY_KIND["Unknown"]
# Kineto names host threads "thread <tid> (<name>)"; nsys knows them by <name> alone.
KINETO_THREAD_NAME = re.compile(r"^thread \d+ \((.*)\)$")
API_VERSION_SUFFIX = re.compile(r"_v\d+$")
TID_BITS = 24  # global_tid = pid << 24 | tid, the layout nsys uses


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
    if path.stat().st_size == 0:
        raise TraceFormatError(f"{path}: file is empty")
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as stream:
                return json.load(stream, parse_float=Decimal)
        with open(path, encoding="utf-8") as stream:
            return json.load(stream, parse_float=Decimal)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceFormatError(f"{path}: damaged or truncated gzip file ({exc or 'unexpected end of data'})") from None
    except UnicodeDecodeError:
        raise TraceFormatError(f"{path}: not a text (JSON) file") from None
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{path}: not valid JSON, or cut short ({exc})") from None


def _trace_events(path: Path) -> list[dict]:
    document = _read_json(path)
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise TraceFormatError(f"{path}: JSON, but not a Chrome trace (no traceEvents list)")
    events = [event for event in events if isinstance(event, dict)]
    is_kineto = isinstance(document, dict) and "schemaVersion" in document
    if not is_kineto and not any(event.get("cat") in KNOWN_CATEGORIES for event in events):
        raise TraceFormatError(f"{path}: a Chrome trace, but not one written by the PyTorch profiler "
                               "(no Kineto events)")
    return events


def _ns(microseconds) -> int:
    return int(Decimal(microseconds) * 1000)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _args(event: dict) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _timed(event: dict) -> bool:
    return event.get("ph") != "M" and isinstance(event.get("ts"), (int, Decimal))


def _span(event: dict, origin: int) -> dict:
    start = _ns(event["ts"]) - origin
    duration = _ns(event.get("dur", 0))
    return {"start": start, "end": start + duration, "duration": duration}


def _host_ids(event: dict) -> dict:
    pid, tid = event["pid"], event["tid"]
    return {"global_tid": (pid << TID_BITS) | tid, "pid": pid, "tid": tid}


def _frame(table: str, rows: list[dict]) -> pd.DataFrame:
    if not rows:
        return empty(table)
    return pd.DataFrame(rows, columns=COLUMNS[table]).sort_values("start", kind="stable").reset_index(drop=True)


def _complete_events(events: list[dict], categories: set[str]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in categories and _timed(e)
            and _is_int(e.get("pid")) and _is_int(e.get("tid"))]


def _nvtx(events: list[dict], origin: int) -> pd.DataFrame:
    rows = [{**_span(e, origin), "name": e.get("name", ""), "style": "PushPop", **_host_ids(e)}
            for e in _complete_events(events, HOST_RANGE_CATEGORIES)]
    return _frame("nvtx", rows)


def _cuda_api(events: list[dict], origin: int) -> pd.DataFrame:
    rows = [{**_span(e, origin), "name": API_VERSION_SUFFIX.sub("", e.get("name", "")), **_host_ids(e),
             "correlation_id": _args(e).get("correlation")}
            for e in _complete_events(events, CUDA_API_CATEGORIES)]
    return _frame("cuda_api", rows)


def _launch_shape(values) -> str | None:
    """[x, y, z] as nsys stats prints a grid or block: "%4d %4d %4d"."""
    if not isinstance(values, list) or len(values) != 3:
        return None
    return "{:4d} {:4d} {:4d}".format(*map(int, values))


def _device_common(event: dict, launching_pid: dict[int, int], only_host_pid: int | None) -> dict:
    args = _args(event)
    correlation = args.get("correlation")
    return {"device_id": args.get("device", args.get("inDevice", event["pid"])),
            "stream_id": args.get("stream", event["tid"]),
            "pid": launching_pid.get(correlation, only_host_pid), "correlation_id": correlation}


def _kernels(events, origin, launching_pid, only_host_pid) -> pd.DataFrame:
    rows = []
    for e in _complete_events(events, {KERNEL_CATEGORY}):
        name, args = e.get("name", ""), _args(e)
        rows.append({**_span(e, origin), "name": name, "short_name": kernel_short_name(name), "mangled_name": None,
                     **_device_common(e, launching_pid, only_host_pid),
                     "grid": _launch_shape(args.get("grid")), "block": _launch_shape(args.get("block"))})
    return _frame("kernels", rows)


def _memop_operation(event: dict) -> str:
    if event["cat"] == MEMSET_CATEGORY:
        return MEMSET_OPERATION
    kind = KINETO_MEMCPY_NAME.match(event.get("name", ""))
    return NSYS_MEMCPY_BY_KIND.get(kind.group(1), UNKNOWN_MEMCPY) if kind else UNKNOWN_MEMCPY


def _memops(events, origin, launching_pid, only_host_pid) -> pd.DataFrame:
    rows = [{**_span(e, origin), "operation": _memop_operation(e), "bytes": _args(e).get("bytes"),
             **_device_common(e, launching_pid, only_host_pid)}
            for e in _complete_events(events, {MEMCPY_CATEGORY, MEMSET_CATEGORY})]
    return _frame("memops", rows)


def _threads(events: list[dict], device_pids: set[int]) -> pd.DataFrame:
    process_names, thread_names = {}, {}
    for e in events:
        if e.get("ph") != "M" or not _is_int(e.get("pid")) or e["pid"] in device_pids:
            continue
        name = str(_args(e).get("name", ""))
        if e.get("name") == "process_name":
            process_names[e["pid"]] = name
        elif e.get("name") == "thread_name" and _is_int(e.get("tid")):
            kineto_name = KINETO_THREAD_NAME.match(name)
            thread_names[(e["pid"], e["tid"])] = kineto_name.group(1) if kineto_name else name
    rows = [{"global_tid": (pid << TID_BITS) | tid, "pid": pid, "tid": tid, "thread_name": name,
             "process_name": process_names.get(pid)} for (pid, tid), name in sorted(thread_names.items())]
    return pd.DataFrame(rows, columns=COLUMNS["threads"]) if rows else empty("threads")


def load_kineto_json(path: str | Path) -> TraceTables:
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file")
    events = _trace_events(path)
    timed = [e for e in events if _timed(e)]
    if not timed:
        return TraceTables(source_path=str(path), span_ns=0)
    origin = min(_ns(e["ts"]) for e in timed)
    span_ns = max(_ns(e["ts"]) + _ns(e.get("dur", 0)) for e in timed) - origin

    nvtx = _nvtx(events, origin)
    cuda_api = _cuda_api(events, origin)
    launches = cuda_api[cuda_api["correlation_id"].notna()]
    launching_pid = dict(zip(launches["correlation_id"], launches["pid"]))
    host_pids = set(nvtx["pid"]) | set(cuda_api["pid"])
    only_host_pid = next(iter(host_pids)) if len(host_pids) == 1 else None
    kernels = _kernels(events, origin, launching_pid, only_host_pid)
    memops = _memops(events, origin, launching_pid, only_host_pid)
    device_pids = {e["pid"] for e in events if e.get("cat") in DEVICE_CATEGORIES and _is_int(e.get("pid"))}

    sources = set()
    if not nvtx.empty:
        sources.add("nvtx")
    if not (cuda_api.empty and kernels.empty and memops.empty):
        sources.add("cuda")
    return TraceTables(source_path=str(path), span_ns=span_ns, sources=sources,
                       threads=_threads(events, device_pids - host_pids), nvtx=nvtx, memops=memops,
                       events=EventStore.from_frames(kernels, cuda_api))
