"""sftprof's built-in SFT loop (`python -m sftprof.capture.sft`) with a capture window closed by time, not
by step: for a long capture of a known length (issue 22: how long nsys takes to export millions
of kernels).

The window opens at the settings' `window.start_step` as usual; after the first step that ends
SFTPROF_LONG_S seconds (default 60) or more after it opened, this program closes it
(cudaProfilerStop, or the nvtx capture range's pop), prints how many steps it held, and ends the
run there, without writing the metrics file (the trainer writes it whole or not at all). Give the
settings a step count larger than the time allows.

    python tests/gpu_programs/long_sft.py SETTINGS_JSON     (as for python -m sftprof.capture.sft)

Used for the long capture of tests/fixtures/nsys2025/README.md (capture_nsys2025.sh, nsys2025_cases.py).
"""

from __future__ import annotations

import os
import sys
import time

from sftprof.capture import sft
from sftprof.capture.sft.annotate import CaptureWindow

LIMIT_S = float(os.environ.get("SFTPROF_LONG_S", "60"))


class WindowClosed(Exception):
    pass


def plant(limit_s: float = LIMIT_S) -> None:
    opened = {}
    before, after = CaptureWindow.before_step, CaptureWindow.after_step

    def before_step(self, step):
        before(self, step)
        if step == self.start_step:
            opened["t"], opened["step"] = time.perf_counter(), step

    def after_step(self, step):
        if "t" in opened and time.perf_counter() - opened["t"] >= limit_s:
            if self.mode == "cudaProfilerApi":
                import torch

                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            elif self.mode == "nvtx":
                self._annotator.pop()
            elapsed = time.perf_counter() - opened["t"]
            raise WindowClosed(f"window closed after step {step}: {step - opened['step'] + 1} steps in {elapsed:.1f} s")
        after(self, step)

    CaptureWindow.before_step, CaptureWindow.after_step = before_step, after_step


if __name__ == "__main__":
    plant()
    try:
        sys.exit(sft.main())
    except WindowClosed as done:
        print(f"long_sft: {done}", flush=True)
        sys.exit(0)
