"""The SFT loop's pieces: response-only loss masking, batching, and the capture window."""

from __future__ import annotations

import pytest

from sftprof.capture.model import build_byte_tokenizer
from sftprof.capture.sft.annotate import CAPTURE_RANGE_NAME, CaptureWindow
from sftprof.capture.sft.torch_backend import IGNORE_INDEX, MicroBatches, encode_example


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def test_byte_tokenizer_round_trips_any_text(tokenizer):
    text = "Grüße, 東京 — résumé!"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_only_response_tokens_carry_labels(tokenizer):
    prompt, response = "### Instruction:\nSay hi.\n\n### Response:\n", "Hi."
    example = encode_example(tokenizer, prompt, response, seq_length=64)
    n_prompt = 1 + len(tokenizer.encode(prompt, add_special_tokens=False))  # BOS + prompt
    n_response = len(tokenizer.encode(response, add_special_tokens=False)) + 1  # + EOS
    labels, ids, mask = example["labels"], example["input_ids"], example["attention_mask"]
    assert len(labels) == len(ids) == len(mask) == 64
    assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert labels[n_prompt : n_prompt + n_response] == ids[n_prompt : n_prompt + n_response]
    assert ids[n_prompt + n_response - 1] == tokenizer.eos_token_id
    assert labels[n_prompt + n_response :] == [IGNORE_INDEX] * (64 - n_prompt - n_response)
    assert mask == [1] * (n_prompt + n_response) + [0] * (64 - n_prompt - n_response)


def test_truncation_keeps_labels_aligned(tokenizer):
    example = encode_example(tokenizer, "p" * 10, "r" * 10, seq_length=15)
    assert example["labels"] == [IGNORE_INDEX] * 11 + example["input_ids"][11:15]


def test_micro_batches_cycle_through_every_example():
    batches = MicroBatches([{"i": i} for i in range(5)], batch_size=2, seed=0)
    seen = [ex["i"] for _ in range(5) for ex in batches.next()]
    assert sorted(seen) == sorted(list(range(5)) * 2)


class RecordingAnnotator:
    route = "recording"

    def __init__(self):
        self.events = []

    def push(self, name):
        self.events.append(("push", name))

    def pop(self):
        self.events.append(("pop",))


def test_nvtx_capture_window_opens_before_start_and_closes_after_end():
    annotator = RecordingAnnotator()
    window = CaptureWindow("nvtx", 2, 3, annotator)
    for step in range(6):
        window.before_step(step)
        annotator.events.append(("step", step))
        window.after_step(step)
    assert annotator.events == [
        ("step", 0),
        ("step", 1),
        ("push", CAPTURE_RANGE_NAME),
        ("step", 2),
        ("step", 3),
        ("pop",),
        ("step", 4),
        ("step", 5),
    ]
    assert [window.contains(s) for s in range(6)] == [False, False, True, True, False, False]


def test_op_ranges_are_on_from_the_windows_opening_to_its_closing(monkeypatch):
    """With op_ranges, emit_nvtx is entered after cudaProfilerStart before the first step and left after the last
    step, before cudaProfilerStop: its ranges fall inside the capture and nowhere else."""
    import torch

    events = []

    class Emit:
        def __enter__(self):
            events.append("emit on")

        def __exit__(self, *exc):
            events.append("emit off")

    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", Emit)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append("stop"))
    annotator = RecordingAnnotator()
    annotator.route = "torch.cuda.nvtx"
    window = CaptureWindow("cudaProfilerApi", 1, 2, annotator, op_ranges=True)
    for step in range(4):
        window.before_step(step)
        events.append(step)
        window.after_step(step)
    assert events == [0, "start", "emit on", 1, 2, "emit off", "stop", 3]


def test_op_ranges_without_cuda_are_a_one_line_error():
    from sftprof.errors import SftprofError

    with pytest.raises(SftprofError, match="CUDA device"):
        CaptureWindow("nvtx", 1, 2, RecordingAnnotator(), op_ranges=True)
