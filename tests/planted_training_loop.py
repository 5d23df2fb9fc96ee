"""A training loop in miniature, for profiling under nsys on a CPU: NVTX `step N` ranges with the
trainer's data/forward/backward/optimizer phases, the model's work done by spinning the CPU.

    python planted_training_loop.py MODE [STEPS]

MODE plants one CPU-visible bottleneck, or none:
  clean         the data phase takes about 1 ms;
  data_starved  the data phase sleeps 40 ms per step, as a slow input pipeline would;
  lock          at each step's start a logger thread flushes metrics for 50 ms holding a lock that
                the optimizer phase needs 31 ms into the step: the training thread waits ~20 ms.
"""

from __future__ import annotations

import sys
import threading
import time

from sftprof.capture.sft.annotate import Annotator

DATA_S = {"clean": 0.001, "data_starved": 0.040, "lock": 0.001}
FORWARD_S, BACKWARD_S, OPTIMIZER_S = 0.010, 0.020, 0.002
LOGGER_HOLDS_S = 0.050


def spin(seconds: float) -> None:
    """CPU work: the GIL is held, no OS call is made."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


class Logger(threading.Thread):
    """Flushes on request, holding `lock` while it writes (slowly)."""

    def __init__(self, lock: threading.Lock):
        super().__init__(daemon=True)
        self.lock, self.requested, self.done = lock, threading.Event(), False

    def run(self) -> None:
        while self.requested.wait() and not self.done:
            self.requested.clear()
            with self.lock:
                time.sleep(LOGGER_HOLDS_S)


def main(mode: str, steps: int) -> None:
    nvtx = Annotator(on_cuda=False)
    if nvtx.route == "none":
        raise SystemExit("libnvToolsExt.so.1 is needed for NVTX ranges on CPU")
    lock = threading.Lock()
    logger = Logger(lock)
    logger.start()
    for step in range(steps):
        with nvtx.range(f"step {step}"):
            if mode == "lock":
                logger.requested.set()
            with nvtx.range("data"):
                time.sleep(DATA_S[mode])
            with nvtx.range("forward"):
                spin(FORWARD_S)
            with nvtx.range("backward"):
                spin(BACKWARD_S)
            with nvtx.range("optimizer"):
                with lock:
                    spin(OPTIMIZER_S)
    logger.done = True
    logger.requested.set()
    logger.join()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
