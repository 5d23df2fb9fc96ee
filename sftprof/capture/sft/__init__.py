"""SFT backends. Each takes the same inputs (HF checkpoint folder, SFT jsonl, settings) and
writes the same per-step metrics file, so the profile and analysis rules do not care which
one ran. The built-in `torch` loop runs anywhere; `nemo` runs inside the NeMo container and
reads a NeMo 2 checkpoint instead of the HF folder.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from sftprof.errors import SftprofError


def _torch_backend(**kwargs) -> dict:
    from sftprof.capture.sft.torch_backend import train

    return train(**kwargs)


def _nemo_backend(**kwargs) -> dict:
    from sftprof.capture.sft.nemo_backend import train

    return train(**kwargs)


BACKENDS = {"torch": _torch_backend, "nemo": _nemo_backend}


def run(
    backend: str, model_dir: str | Path, train_jsonl: str | Path, metrics_path: str | Path, sft: dict, window: dict
) -> dict:
    """Run one backend. `metrics_path` may hold `{rank}`, filled with this process's RANK."""
    metrics_path = str(metrics_path).format(rank=os.environ.get("RANK", "0"))
    try:
        entry = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown SFT backend {backend!r}; known: {', '.join(BACKENDS)}") from None
    return entry(model_dir=model_dir, train_jsonl=train_jsonl, metrics_path=metrics_path, sft=sft, window=window)


def backend_settings(sft: dict) -> dict:
    """The `sft` settings the chosen backend reads: the nemo block only matters to nemo, the
    built-in loop's switches only to it (so changing them reruns no nemo window)."""
    from sftprof.capture.sft.torch_backend import SWITCHES

    ignored = SWITCHES if sft["backend"] == "nemo" else ("nemo",)
    return {key: value for key, value in sft.items() if key not in ignored}


def command(
    model_dir: str | Path,
    train_jsonl: str | Path,
    metrics_path: str | Path,
    sft: dict,
    window: dict,
    python: str = sys.executable,
) -> list[str]:
    """The argv that runs one SFT job in a fresh interpreter (the program nsys profiles).

    `python` is this interpreter by default; inside a container it is the container's own.
    """
    settings = {
        "model_dir": str(model_dir),
        "train_jsonl": str(train_jsonl),
        "metrics_path": str(metrics_path),
        "sft": backend_settings(sft),
        "window": window,
    }
    return [python, "-m", "sftprof.capture.sft", json.dumps(settings)]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(
            "usage: python -m sftprof.capture.sft SETTINGS_JSON  (built by sftprof.capture.sft.command)",
            file=sys.stderr,
        )
        return 2
    settings = json.loads(argv[0])
    try:
        result = run(
            settings["sft"]["backend"],
            settings["model_dir"],
            settings["train_jsonl"],
            settings["metrics_path"],
            settings["sft"],
            settings["window"],
        )
    except SftprofError as error:  # settings this run cannot take: one line in the profile log, no traceback
        print(f"sftprof.capture.sft: error: {error}", file=sys.stderr)
        return 1
    logging.getLogger("sftprof.capture.sft").info("done: %s", result)
    return 0
