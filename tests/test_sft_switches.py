"""The built-in trainer's switches (sft.padding, pin_memory, fused_optimizer, loss_every, compile),
its weight dtype, examples that seq_length leaves without a label, and the per-step and per-run
facts of its metrics: real training runs of a tiny Llama on CPU (and on CUDA where there is one)."""

from __future__ import annotations

import copy
import itertools
import json
import logging
import os
import shutil
import time

import pytest
import torch

from sftprof.capture import config, sft
from sftprof.capture.data import generate_sample, to_sft_example, write_jsonl
from sftprof.capture.model import build_byte_tokenizer, create_tiny_llama
from sftprof.capture.sft.torch_backend import (
    SWITCHES,
    SeqLengthError,
    StepClock,
    collate,
    encode_example,
    encode_examples,
    padded_length,
    train,
)
from sftprof.report.html import read_metrics

from conftest import SMALL_DEMO

on_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
NO_WINDOW = {"capture_range": "none"}
RUN_KEYS = {"parameters", "weight_dtype", "precision", "model", "device_name", *SWITCHES}


@pytest.fixture(scope="module")
def experiment():
    """The small demo's settings with the schema's defaults filled in."""
    return config.validate(copy.deepcopy(SMALL_DEMO))["experiments"]["demo"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, experiment):
    folder = tmp_path_factory.mktemp("model") / "tiny"
    create_tiny_llama(experiment["model"], folder)
    return folder


@pytest.fixture(scope="module")
def train_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "training.jsonl"
    write_jsonl(path, [to_sft_example(record) for record in generate_sample(24, seed=0)])
    return path


@pytest.fixture
def run_sft(tmp_path, experiment, model_dir, train_jsonl):
    """Train with the demo's settings changed by `changes`; returns the metrics lines."""
    runs = itertools.count()

    def run(model=model_dir, **changes) -> list[dict]:
        settings = {**experiment["sft"], "steps": 4, "seq_length": 512, **changes}
        metrics = tmp_path / f"run{next(runs)}.metrics.jsonl"
        train(model, train_jsonl, metrics, settings, NO_WINDOW)
        read_metrics(metrics)  # the report's reader takes the file
        return [json.loads(line) for line in metrics.read_text().splitlines()]

    return run


def test_switches_default_to_the_loop_as_it_was(experiment):
    assert {key: experiment["sft"][key] for key in SWITCHES} == {
        "padding": "max_length",
        "pad_to_multiple_of": 1,
        "pin_memory": False,
        "fused_optimizer": False,
        "loss_every": 1,
        "compile": False,
        "ddp_overlap": True,
        "attention": "sdpa",
        "cuda_alloc_conf": "",
        "gradient_checkpointing": False,
        "pad_vocab_to_multiple_of": 0,
    }


@pytest.mark.parametrize(
    "key, value",
    [
        ("padding", "shortest"),
        ("pad_to_multiple_of", 0),
        ("pin_memory", "yes"),
        ("fused_optimizer", 1),
        ("loss_every", 0),
        ("loss_every", 2.0),
        ("compile", None),
        ("ddp_overlap", "off"),
        ("attention", "flash"),
        ("gradient_checkpointing", "yes"),
        ("pad_vocab_to_multiple_of", -64),
        ("pad_vocab_to_multiple_of", "64"),
        ("cuda_alloc_conf", "expandable_segments:True; rm -rf /"),
    ],
)
def test_bad_switch_values_name_their_key(key, value):
    cfg = copy.deepcopy(SMALL_DEMO)
    cfg["experiments"]["demo"]["sft"][key] = value
    with pytest.raises(config.ConfigError, match=f"experiments.demo.sft.{key}"):
        config.validate(cfg)


def test_switches_reach_the_torch_trainer_and_not_nemo(experiment):
    settings = {**experiment["sft"], "padding": "longest", "loss_every": 4}
    argv = sft.command("model", "train.jsonl", "metrics.jsonl", settings, NO_WINDOW)
    passed = json.loads(argv[-1])["sft"]
    assert passed["padding"] == "longest" and passed["loss_every"] == 4 and "nemo" not in passed
    nemo = sft.backend_settings({**settings, "backend": "nemo"})
    assert "nemo" in nemo and not set(SWITCHES) & set(nemo)


def test_metrics_hold_step_facts_and_the_run_facts_once(run_sft, experiment):
    lines = run_sft()
    micro, accum = experiment["sft"]["micro_batch_size"], experiment["sft"]["grad_accum_steps"]
    assert [line["step"] for line in lines] == [0, 1, 2, 3]
    for line in lines:
        assert line["token_slots"] == micro * accum * 512 and line["padded_lengths"] == [512] * accum
        assert 0 < line["label_tokens"] < line["real_tokens"] == line["tokens"] < line["token_slots"]
        assert line["tokens_per_s"] == pytest.approx(line["tokens"] / line["step_time_s"])
    assert set(lines[0]["run"]) == RUN_KEYS and not any("run" in line for line in lines[1:])
    run = lines[0]["run"]
    model = experiment["model"]
    assert run["model"] == {
        "architecture": "LlamaForCausalLM",
        "num_layers": model["num_layers"],
        "hidden_size": model["hidden_size"],
        "intermediate_size": model["intermediate_size"],
        "num_heads": model["num_heads"],
        "num_kv_heads": model["num_kv_heads"],
        "vocab_size": len(build_byte_tokenizer()),
        "seq_length": 512,
        "embedding_parameters": len(build_byte_tokenizer()) * model["hidden_size"],
    }
    assert run["parameters"] > run["model"]["embedding_parameters"] > 0
    assert run["weight_dtype"] == "float32" and run["precision"] is None and run["device_name"]
    assert (
        run["padding"],
        run["pad_to_multiple_of"],
        run["pin_memory"],
        run["fused_optimizer"],
        run["loss_every"],
        run["compile"],
        run["ddp_overlap"],
        run["attention"],
        run["cuda_alloc_conf"],
        run["gradient_checkpointing"],
    ) == ("max_length", 1, False, False, 1, False, None, "sdpa", "", False)


def test_longest_padding_computes_fewer_positions_for_the_same_loss(run_sft):
    padded, longest, rounded = run_sft(), run_sft(padding="longest"), run_sft(padding="longest", pad_to_multiple_of=64)
    micro = padded[0]["token_slots"] // sum(padded[0]["padded_lengths"])
    for full, trimmed, bucketed in zip(padded, longest, rounded):
        for line in trimmed, bucketed:
            assert line["real_tokens"] == full["real_tokens"] and line["label_tokens"] == full["label_tokens"]
            assert line["token_slots"] == micro * sum(line["padded_lengths"]) < full["token_slots"]
            assert line["loss"] == pytest.approx(full["loss"], rel=1e-4)
        assert [-(-length // 64) * 64 for length in trimmed["padded_lengths"]] == bucketed["padded_lengths"]
    assert (longest[0]["run"]["padding"], rounded[0]["run"]["pad_to_multiple_of"]) == ("longest", 64)


def test_longest_padding_cuts_to_the_longest_example_rounded_up_within_seq_length():
    tokenizer = build_byte_tokenizer()
    examples = [encode_example(tokenizer, "p" * 3, "r", 16), encode_example(tokenizer, "p" * 5, "rr", 16)]
    assert [sum(example["attention_mask"]) for example in examples] == [6, 9]  # BOS, prompt, response, EOS
    assert padded_length(examples, "max_length", 1) == padded_length(examples, "longest", 64) == 16
    assert (padded_length(examples, "longest", 1), padded_length(examples, "longest", 4)) == (9, 12)
    batch = collate(examples, 9, "cpu", pin_memory=False)
    assert batch.tensors["input_ids"].tolist() == [example["input_ids"][:9] for example in examples]
    assert {tensor.shape for tensor in batch.tensors.values()} == {torch.Size([2, 9])}
    assert (batch.token_slots, batch.real_tokens, batch.label_tokens) == (18, 15, 2 + 3)


def test_loss_every_reads_the_loss_on_every_nth_and_the_last_step(run_sft):
    every, third = run_sft(steps=7), run_sft(steps=7, loss_every=3)
    assert [line["loss"] is None for line in third] == [True, True, False, True, True, False, False]
    for read, reference in zip(third, every):
        assert read["loss"] is None or read["loss"] == pytest.approx(reference["loss"], abs=1e-6)
        assert read["step_time_s"] > 0
    assert third[0]["run"]["loss_every"] == 3


def test_fused_optimizer_runs_on_cpu_and_pin_memory_says_it_is_ignored(run_sft, caplog):
    reference = run_sft(steps=3)
    with caplog.at_level(logging.INFO, logger="sftprof.capture.sft.torch_backend"):
        lines = run_sft(steps=3, fused_optimizer=True, pin_memory=True)
    assert "sft.pin_memory is ignored on cpu" in caplog.text
    assert lines[0]["run"]["fused_optimizer"] is True and lines[0]["run"]["pin_memory"] is False
    assert [line["loss"] for line in lines] == pytest.approx([line["loss"] for line in reference], rel=1e-4)


def test_eager_attention_trains_to_the_same_loss_and_the_allocator_setting_reaches_torch(run_sft, monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    sdpa = run_sft(steps=2, seq_length=128)
    eager = run_sft(steps=2, seq_length=128, attention="eager", cuda_alloc_conf="expandable_segments:True")
    assert [line["loss"] for line in eager] == pytest.approx([line["loss"] for line in sdpa], rel=1e-4)
    assert (eager[0]["run"]["attention"], eager[0]["run"]["cuda_alloc_conf"]) == ("eager", "expandable_segments:True")
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_the_vocabulary_grows_to_the_multiple_asked_for_and_trains(run_sft, experiment):
    """The tiny model's byte vocabulary (260) grows to 320; the new rows are no token's, so the loss changes
    only by the softmax's few more classes."""
    kept, padded = run_sft(steps=2, seq_length=128), run_sft(steps=2, seq_length=128, pad_vocab_to_multiple_of=64)
    assert kept[0]["run"]["model"]["vocab_size"] % 8 and padded[0]["run"]["model"]["vocab_size"] == 320
    assert padded[0]["run"]["pad_vocab_to_multiple_of"] == 64
    assert [line["loss"] for line in padded] == pytest.approx([line["loss"] for line in kept], rel=0.05)


def test_gradient_checkpointing_trains_to_the_same_loss(run_sft):
    kept, recomputed = run_sft(steps=2, seq_length=128), run_sft(steps=2, seq_length=128, gradient_checkpointing=True)
    assert [line["loss"] for line in recomputed] == pytest.approx([line["loss"] for line in kept], rel=1e-4)
    assert recomputed[0]["run"]["gradient_checkpointing"] is True


@pytest.mark.e2e
@pytest.mark.ci_sample(0)  # torch.compile on the CPU, 24 s: the full test run has it
def test_compiled_model_trains_to_the_same_loss(run_sft):
    """About a minute on CPU: inductor compiles forward and backward once (max_length keeps one shape)."""
    reference, compiled = run_sft(steps=2, seq_length=128), run_sft(steps=2, seq_length=128, compile=True)
    assert compiled[0]["run"]["compile"] is True
    assert [line["loss"] for line in compiled] == pytest.approx([line["loss"] for line in reference], rel=1e-3)


def test_fp16_checkpoint_trains_with_float32_weights_under_bf16_autocast(run_sft, model_dir, tmp_path):
    from transformers import LlamaForCausalLM

    fp16_dir = tmp_path / "fp16"
    shutil.copytree(model_dir, fp16_dir)  # the tokenizer; the weights are overwritten in fp16
    LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float16).save_pretrained(fp16_dir)
    assert json.loads((fp16_dir / "config.json").read_text())["dtype"] == "float16"
    [line] = run_sft(model=fp16_dir, steps=1, precision="bf16")
    assert (line["run"]["weight_dtype"], line["run"]["precision"]) == ("float32", "bfloat16")


def test_bf16_true_trains_bf16_weights_without_autocast_to_about_the_same_loss(run_sft):
    """precision bf16-true (float32_weights' remedy): the weights, and so AdamW's state, are bf16; no autocast. The
    loss follows the float32 weights' under autocast within bf16's resolution."""
    mixed, true = (
        run_sft(steps=2, seq_length=128, precision="bf16"),
        run_sft(steps=2, seq_length=128, precision="bf16-true"),
    )
    assert (true[0]["run"]["weight_dtype"], true[0]["run"]["precision"]) == ("bfloat16", None)
    assert [line["loss"] for line in true] == pytest.approx([line["loss"] for line in mixed], rel=2e-2)


def test_examples_without_label_tokens_are_dropped_and_counted(caplog):
    tokenizer = build_byte_tokenizer()
    rows = [{"input": "p" * 10, "output": "answer"}, {"input": "p" * 40, "output": "lost"}]
    with caplog.at_level(logging.WARNING, logger="sftprof.capture.sft.torch_backend"):
        [kept] = encode_examples(tokenizer, rows, seq_length=32)
    assert kept["input_ids"][1:11] == tokenizer.encode("p" * 10, add_special_tokens=False)
    assert "sft.seq_length=32 cuts off every response token of 1 of 2 training examples" in caplog.text


def test_a_seq_length_that_cuts_every_response_is_an_error(run_sft):
    with pytest.raises(
        SeqLengthError,
        match=r"sft.seq_length=16 cuts off every response token of all 24 "
        r"training examples; raise seq_length or drop long prompts",
    ):
        run_sft(seq_length=16)


@on_cuda
def test_step_clock_times_gpu_work_without_a_sync_per_step():
    """Host-side timers see only the enqueueing of GPU work; the clock's events see the work."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    torch.cuda._sleep(100_000_000)
    torch.cuda.synchronize()
    sleep_s = time.perf_counter() - started
    clock = StepClock("cuda")
    enqueued = time.perf_counter()
    for _ in range(3):
        clock.start()
        torch.cuda._sleep(100_000_000)
        clock.stop()
    enqueued = time.perf_counter() - enqueued
    durations = clock.durations()
    assert enqueued < sleep_s / 2 and durations == pytest.approx([sleep_s] * 3, rel=0.2)
    assert clock.durations() == []


@on_cuda
def test_cuda_run_with_every_switch(run_sft):
    lines = run_sft(
        device="cuda",
        steps=6,
        padding="longest",
        pad_to_multiple_of=64,
        pin_memory=True,
        fused_optimizer=True,
        loss_every=3,
        precision="bf16",
    )
    run = lines[0]["run"]
    assert (run["pin_memory"], run["fused_optimizer"], run["precision"]) == (True, True, "bfloat16")
    assert run["device_name"] == torch.cuda.get_device_name()
    assert [line["loss"] is None for line in lines] == [True, True, False, True, True, False]
    assert all(line["step_time_s"] > 0 and line["padded_lengths"][0] % 64 == 0 for line in lines)
