"""sftprof's NeMo recipe built by real NeMo 2.2.1 code (optional: needs .nemo-venv, see docs/NEMO.md).

Runs tests/gpu_programs/nemo_recipe_build.py with .nemo-venv's python: `finetune_recipe` of
llm.llama2_7b as nemo_backend.build_recipe configures it (LoRA, full, and full with every sft.nemo knob
on), then fdl.build of the trainer (accelerator cpu here), of the whole llm.finetune partial, and a
collated batch of the data module over a tiny dolly-format split (packed for real with the knobs).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO

PYTHON = REPO / ".nemo-venv" / "bin" / "python"
pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason="no .nemo-venv (NeMo 2.2.1); see docs/NEMO.md")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    work = tmp_path_factory.mktemp("nemo")
    done = subprocess.run(
        [str(PYTHON), str(REPO / "tests" / "gpu_programs" / "nemo_recipe_build.py"), str(work)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=work,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("NEMO_RECIPE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("NEMO_RECIPE "))["runs"]


@pytest.mark.parametrize("peft", ["lora", "none"])
def test_recipe_builds_with_sftprof_settings(built, peft):
    run = built[peft]
    assert run["task"] == "finetune" and run["strategy"] == "MegatronStrategy"
    assert run["tensor_parallel"] == 1 and run["max_steps"] == 4 and run["limit_val_batches"] == 0
    assert run["precision"] == "bf16-mixed" and run["log_ckpt"] is None and run["resume"] is None
    assert run["nsys_callback"] == []  # without op_ranges the metrics callback opens the window
    assert run["model"] == "LlamaModel" and run["config"] == "Llama2Config7B"
    fields = run["config_fields"]
    assert (fields["num_layers"], fields["hidden_size"], fields["ffn_hidden_size"], fields["vocab_size"]) == (
        32,
        4096,
        11008,
        32000,
    )
    assert fields["seq_length"] == 128 and run["batch_tokens_shape"] == [2, 128]  # padded to seq_length
    assert run["data"] == "FineTuningDataModule" and run["global_batch_size"] == 2
    assert run["peft"] == ("LoRA" if peft == "lora" else None)
    assert fields["cross_entropy_loss_fusion"] is (peft == "none")
    if run["layer_spec"] == "local":  # no Transformer Engine: the fusions the local spec cannot run are off
        assert not fields["apply_rope_fusion"] and not fields["masked_softmax_fusion"]
        assert not fields["persist_layer_norm"]


def test_knobs_reach_the_built_objects(built):
    """What sftprof suggest may set on a nemo run, each read on the object NeMo trains with."""
    plain, knobs = built["none"], built["knobs"]
    assert (plain["overlap_grad_reduce"], plain["overlap_param_gather"]) == (False, False)
    assert (knobs["overlap_grad_reduce"], knobs["overlap_param_gather"]) == (True, True)  # strategy.ddp_config
    assert not plain["config_fields"]["enable_cuda_graph"] and not plain["strategy_te_rng_tracker"]
    assert knobs["config_fields"]["enable_cuda_graph"] and knobs["config_fields"]["use_te_rng_tracker"]
    assert knobs["strategy_te_rng_tracker"]
    # Two examples of 128 a micro-batch become one pack of 256 (NeMo packs into micro-batches of one),
    # with cu_seqlens padded for the graphs.
    assert plain["packed_sequence_size"] == -1 and "cu_seqlens" not in plain["batch_keys"]
    assert (knobs["packed_sequence_size"], knobs["micro_batch_size"], knobs["global_batch_size"]) == (256, 1, 2)
    assert knobs["pad_cu_seqlens"] and knobs["config_fields"]["seq_length"] == 256
    assert "cu_seqlens" in knobs["batch_keys"] and knobs["batch_tokens_shape"] == [1, 256]


def test_op_ranges_open_the_window_with_nsys_callback(built):
    assert built["lora_ops"]["nsys_callback"] == [{"start": 1, "end": 3, "ranks": [0]}]  # window 1..2 inclusive
