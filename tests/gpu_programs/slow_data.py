"""sftprof's built-in SFT loop with a planted data stall: a CPU sleep in the data path.

The trainer has no switch for this (nor should it): this program wraps
sftprof.capture.sft.torch_backend.MicroBatches.next, which the trainer calls inside each micro-batch's
"data" NVTX range, with a sleep of SLEEP_S (the time a slow tokenizer, decoder or file read
would take), then runs `python -m sftprof.capture.sft`'s main with the same settings argument. With
loss_every 1 the host waits for the GPU at the end of every step, so the GPU sits idle for the
first micro-batch's sleep of each step. The fix is the same run without the sleep.

    python tests/gpu_programs/slow_data.py SETTINGS_JSON     (as for python -m sftprof.capture.sft)

Used for tests/fixtures/h200_sft_data_stall.* (see tests/fixtures/README.md and sft_cases.py).
"""

from __future__ import annotations

import functools
import os
import sys
import time

from sftprof.capture import sft
from sftprof.capture.sft.torch_backend import MicroBatches

SLEEP_S = float(os.environ.get("SFTPROF_SLOW_DATA_S", "0.1"))  # per micro-batch


def plant(sleep_s: float = SLEEP_S) -> None:
    original = MicroBatches.next

    @functools.wraps(original)
    def slow_next(self):
        time.sleep(sleep_s)
        return original(self)

    MicroBatches.next = slow_next


if __name__ == "__main__":
    plant()
    sys.exit(sft.main())
