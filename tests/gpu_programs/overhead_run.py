"""sftprof's built-in SFT loop, optionally with torch.autograd.profiler.emit_nvtx over its capture window.

The trainer has no switch for op-level NVTX (NeMo's NsysCallback turns emit_nvtx on as it opens the window);
this program does what that callback does to the built-in loop: with --emit-nvtx, emit_nvtx is entered
as the window opens (before its first step) and left after its last, then `python -m sftprof.capture.sft`'s
main runs with the same settings argument. Used by overhead_matrix.py.

    python tests/gpu_programs/overhead_run.py [--emit-nvtx] SETTINGS_JSON
"""

from __future__ import annotations

import sys

from sftprof.capture import sft
from sftprof.capture.sft import torch_backend
from sftprof.capture.sft.annotate import CaptureWindow


class EmitNvtxWindow(CaptureWindow):
    """The trainer's capture window, with emit_nvtx on over the window's steps."""

    def before_step(self, step: int) -> None:
        super().before_step(step)
        if step == self.start_step:
            import torch

            self._emit = torch.autograd.profiler.emit_nvtx()
            self._emit.__enter__()

    def after_step(self, step: int) -> None:
        if step == self.end_step:
            self._emit.__exit__(None, None, None)
        super().after_step(step)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--emit-nvtx"]:
        torch_backend.CaptureWindow = EmitNvtxWindow
        argv = argv[1:]
    sys.exit(sft.main(argv))
