"""NVTX ranges and capture windows that Nsight Systems really records, on GPU and on CPU.

On CUDA, torch.cuda.nvtx and torch.cuda.profiler (cudaProfilerStart/Stop, for
`--capture-range=cudaProfilerApi`). On a CPU-only machine torch has no NVTX, and the ranges of
the `nvtx` PyPI package are not recorded by nsys 2022.4; the NVTX v2 C library
(libnvToolsExt.so.1, Debian's libnvtoolsext1) is, so it is called through ctypes.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from sftprof.errors import SftprofError

log = logging.getLogger(__name__)

# The NVTX range a step window opens; nsys is told to start capturing when it is pushed.
CAPTURE_RANGE_NAME = "sftprof_capture"
NVTX_V2_LIBRARY = "libnvToolsExt.so.1"


class _TorchCudaNvtx:
    def __init__(self):
        import torch.cuda.nvtx as nvtx

        self._nvtx = nvtx

    def push(self, name: str) -> None:
        self._nvtx.range_push(name)

    def pop(self) -> None:
        self._nvtx.range_pop()


class _NvtxV2Library:
    def __init__(self, library: ctypes.CDLL):
        self._push = library.nvtxRangePushA
        self._push.argtypes = [ctypes.c_char_p]
        self._push.restype = ctypes.c_int
        self._pop = library.nvtxRangePop
        self._pop.restype = ctypes.c_int

    def push(self, name: str) -> None:
        self._push(name.encode())

    def pop(self) -> None:
        self._pop()


class _NoNvtx:
    def push(self, name: str) -> None:
        pass

    def pop(self) -> None:
        pass


class Annotator:
    """Push/pop NVTX ranges with whichever NVTX route works on this device."""

    def __init__(self, on_cuda: bool):
        self._impl: _TorchCudaNvtx | _NvtxV2Library | _NoNvtx
        if on_cuda:
            self._impl = _TorchCudaNvtx()
            self.route = "torch.cuda.nvtx"
            return
        try:
            self._impl = _NvtxV2Library(ctypes.CDLL(NVTX_V2_LIBRARY))
            self.route = NVTX_V2_LIBRARY
        except OSError:
            log.warning(
                "%s not found (Debian: apt-get install libnvtoolsext1): training runs "
                "without NVTX ranges, and an nvtx capture window cannot open",
                NVTX_V2_LIBRARY,
            )
            self._impl = _NoNvtx()
            self.route = "none"

    @contextmanager
    def range(self, name: str) -> Iterator[None]:
        self._impl.push(name)
        try:
            yield
        finally:
            self._impl.pop()

    def push(self, name: str) -> None:
        self._impl.push(name)

    def pop(self) -> None:
        self._impl.pop()


class OpRangesError(SftprofError, ValueError):
    """Op ranges asked for where emit_nvtx cannot write them."""


class CaptureWindow:
    """Opens the profiler's capture at start_step and closes it after end_step (inclusive).

    Mirrors NeMo's NsysCallback: `cudaProfilerApi` calls cudaProfilerStart/Stop, `nvtx` pushes
    and pops the CAPTURE_RANGE_NAME range that `nsys --nvtx-capture` waits for, `none` does
    nothing (a time window, or no profiler). With op_ranges, emit_nvtx is on from the window's
    opening to its closing: a range per PyTorch op, inside the window only.
    """

    def __init__(
        self, mode: str, start_step: int | None, end_step: int | None, annotator: Annotator, op_ranges: bool = False
    ):
        self.mode, self.start_step, self.end_step = mode, start_step, end_step
        self._annotator = annotator
        self._op_ranges = None
        if mode == "nvtx" and annotator.route == "none":
            raise RuntimeError(f"an nvtx capture window needs {NVTX_V2_LIBRARY} or CUDA")
        if op_ranges:
            if mode == "none" or annotator.route != "torch.cuda.nvtx":
                raise OpRangesError("op_ranges needs a step window on a CUDA device (emit_nvtx writes no ranges else)")
            import torch

            self._op_ranges = torch.autograd.profiler.emit_nvtx()

    def contains(self, step: int) -> bool:
        return self.mode != "none" and self.start_step <= step <= self.end_step

    def before_step(self, step: int) -> None:
        if self.mode == "none" or step != self.start_step:
            return
        if self.mode == "nvtx":
            self._annotator.push(CAPTURE_RANGE_NAME)
        else:
            import torch.cuda.profiler

            torch.cuda.profiler.start()
        if self._op_ranges is not None:
            self._op_ranges.__enter__()

    def after_step(self, step: int) -> None:
        if self.mode == "none" or step != self.end_step:
            return
        if self._op_ranges is not None:
            self._op_ranges.__exit__(None, None, None)
        if self.mode == "nvtx":
            self._annotator.pop()
        else:
            import torch.cuda.profiler

            torch.cuda.profiler.stop()
