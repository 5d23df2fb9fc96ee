"""The NeMo backend's capture window without op ranges: its metrics callback calls cudaProfilerStart before the
window's first step and cudaProfilerStop after its last, where NsysCallback would (and emit_nvtx stays off).
Lightning is stood in for by a module of one class: the hooks are sftprof's own code."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from sftprof.capture.sft import nemo_backend

from conftest import NEMO_LORA


@pytest.fixture
def lightning(monkeypatch):
    pytorch = types.ModuleType("lightning.pytorch")
    pytorch.Callback = type("Callback", (), {})
    package = types.ModuleType("lightning")
    package.pytorch = pytorch
    monkeypatch.setitem(sys.modules, "lightning", package)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", pytorch)


def settings(window, op_ranges: bool) -> dict:
    sft = {"micro_batch_size": 1, "grad_accum_steps": 2, "seq_length": 64, "steps": 6, "learning_rate": 1e-4}
    sft["nemo"] = NEMO_LORA
    planned = nemo_backend.plan(sft, {**window, "op_ranges": op_ranges}, {"WORLD_SIZE": "1"})
    planned["layer_spec"] = "local"
    return planned


def run_steps(tmp_path, monkeypatch, planned: dict, steps: int) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []
    trainer = SimpleNamespace(global_step=0)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append(("start", trainer.global_step)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append(("stop", trainer.global_step - 1)))
    callback = nemo_backend._step_metrics_callback(tmp_path / "m.jsonl", 0, planned, 2)
    module = torch.nn.Linear(2, 2)
    module.config = SimpleNamespace(
        num_layers=1, hidden_size=2, ffn_hidden_size=2, num_attention_heads=1, num_query_groups=1, vocab_size=2
    )
    callback.on_train_start(trainer, module)
    for _ in range(steps):
        callback.on_train_batch_start(trainer, module, None, 0)
        trainer.global_step += 1
        callback.on_train_batch_end(trainer, module, {"loss": torch.tensor(1.0)}, None, 0)
    callback.on_train_end(trainer, module)
    return calls


def test_without_op_ranges_the_metrics_callback_opens_the_window(tmp_path, monkeypatch, lightning):
    window = {"capture_range": "cudaProfilerApi", "start_step": 2, "end_step": 3}
    calls = run_steps(tmp_path, monkeypatch, settings(window, op_ranges=False), 6)
    assert calls == [("start", 2), ("stop", 3)]  # the inclusive window 2..3, as NsysCallback's (2, 4)
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line["in_window"]] == [2, 3]
    assert lines[0]["run"]["op_ranges"] is False


def test_with_op_ranges_nsys_callback_opens_it(tmp_path, monkeypatch, lightning):
    window = {"capture_range": "cudaProfilerApi", "start_step": 2, "end_step": 3}
    assert run_steps(tmp_path, monkeypatch, settings(window, op_ranges=True), 6) == []
