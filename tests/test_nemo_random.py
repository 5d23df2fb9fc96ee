"""`model.source: random`: a published architecture with random weights, from one table, for both backends."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from sftprof.capture import config, jobs, model
from sftprof.capture.sft import nemo_backend

from conftest import NEMO_LORA, REPO, SMALL_DEMO


def random_experiment(architecture="llama2-7b", **sft):
    cfg = copy.deepcopy(SMALL_DEMO)
    name = next(iter(cfg["experiments"]))
    cfg["experiments"][name]["model"] = {"source": "random", "architecture": architecture}
    cfg["experiments"][name].setdefault("sft", {}).update(sft)
    return name, cfg


def test_schema_offers_random_and_names_every_table_architecture():
    schema = yaml.safe_load((REPO / "sftprof" / "capture" / "config.schema.yaml").read_text())
    props = schema["definitions"]["model"]["properties"]
    assert "random" in props["source"]["enum"]
    assert props["architecture"]["default"] in model.ARCHITECTURES
    for name in model.ARCHITECTURES:  # the description lists what the table offers, no more, no less
        assert name in props["architecture"]["description"]


def test_random_source_validates_against_the_table():
    name, cfg = random_experiment()
    assert config.validate(cfg)["experiments"][name]["model"]["architecture"] == "llama2-7b"
    _, bad = random_experiment("llama9-1t")
    with pytest.raises(config.ConfigError, match="llama9-1t.*llama2-7b"):
        config.validate(bad)
    _, long = random_experiment(seq_length=8192)
    with pytest.raises(config.ConfigError, match="seq_length"):
        config.validate(long)


def test_llama2_7b_is_the_published_architecture(tmp_path):
    summary = model.create_random_model({"architecture": "llama2-7b", "seed": 3}, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
    ) == (4096, 32, 32, 11008, 32000)
    assert summary["parameters"] == 6_738_415_616  # Llama-2-7b-hf's count
    assert summary["nemo_config"] == "Llama2Config7B" and model.is_random(tmp_path / "m")
    assert not list((tmp_path / "m").glob("*.safetensors")) and not (tmp_path / "m.partial").exists()


def test_torch_backend_initialises_a_random_folder_seeded_in_float32(tmp_path, monkeypatch):
    small = {
        "hf": {
            **model.ARCHITECTURES["llama2-7b"]["hf"],
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "vocab_size": 300,
        },
        "nemo": "Llama2Config7B",
    }
    monkeypatch.setitem(model.ARCHITECTURES, "tiny-test", small)
    model.create_random_model({"architecture": "tiny-test", "seed": 0}, tmp_path / "m")
    first, second = (model.load_model(tmp_path / "m", "cpu", seed=5) for _ in range(2))
    weights = next(first.parameters())
    assert str(weights.dtype) == "torch.float32" and first.config.vocab_size == 300
    assert all((a == b).all() for a, b in zip(first.parameters(), second.parameters()))


def test_nemo_random_model_skips_the_checkpoint_import():
    name, cfg = random_experiment()
    experiment = config.validate(cfg)["experiments"][name]
    experiment["sft"]["backend"] = "nemo"
    assert not jobs.needs_nemo_checkpoint(experiment)
    experiment["model"]["source"] = "tiny"
    assert jobs.needs_nemo_checkpoint(experiment)


def test_nemo_plan_window_end_is_exclusive():
    sft = {
        "micro_batch_size": 1,
        "grad_accum_steps": 2,
        "seq_length": 1024,
        "steps": 5,
        "learning_rate": 1e-4,
        "nemo": dict(NEMO_LORA),
    }
    window = {"capture_range": "cudaProfilerApi", "start_step": 2, "end_step": 3}
    settings = nemo_backend.plan(sft, window, {"WORLD_SIZE": "1"})
    assert settings["nsys_steps"] == (2, 4) and settings["global_batch_size"] == 2
    assert settings["packed_sequence_size"] is None
    # Packing: NeMo's micro-batch of one holds what micro_batch_size examples held, as one pack.
    sft = {**sft, "micro_batch_size": 4, "nemo": {**sft["nemo"], "packed_sequence": True}}
    packed = nemo_backend.plan(sft, window, {"WORLD_SIZE": "2"})
    assert (packed["micro_batch_size"], packed["global_batch_size"], packed["packed_sequence_size"]) == (1, 4, 4096)


@pytest.mark.parametrize(
    "packed, graphs, named",
    [
        (True, False, "sft.nemo.packed_sequence needs"),
        (False, True, "sft.nemo.cuda_graphs needs"),
        (True, True, "sft.nemo.packed_sequence and sft.nemo.cuda_graphs need "),
        (False, False, None),
    ],
)
def test_knobs_the_local_spec_cannot_run_are_refused_before_training(packed, graphs, named):
    """Without Transformer Engine megatron-core's attention refuses packed sequences and its CUDA graphs assert
    TE: the backend says so in one line before training, where NeMo would fail mid-run."""
    knobs = {"packed_sequence": packed, "cuda_graphs": graphs, "overlap_grad_reduce": True}
    if named is None:
        nemo_backend._check_stack(knobs, "local")
    else:
        with pytest.raises(nemo_backend.StackError, match=named):
            nemo_backend._check_stack(knobs, "local")
    nemo_backend._check_stack(knobs, "transformer_engine")


def test_a_setting_the_run_cannot_take_is_one_line_in_the_log(monkeypatch, capsys):
    """`python -m sftprof.capture.sft` prints an SftprofError as one line and exits 1: the profile log says why."""

    from sftprof.capture import sft

    def refuse(**_):
        raise nemo_backend.StackError("sft.nemo.cuda_graphs needs Transformer Engine")

    monkeypatch.setitem(sft.BACKENDS, "nemo", refuse)
    settings = {"sft": {"backend": "nemo"}, "model_dir": "m", "train_jsonl": "t", "metrics_path": "x", "window": {}}
    assert sft.main([json.dumps(settings)]) == 1
    err = capsys.readouterr().err
    assert err == "sftprof.capture.sft: error: sft.nemo.cuda_graphs needs Transformer Engine\n"
