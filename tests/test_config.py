"""Config validation: the schema's defaults, and errors that name the offending key."""

from __future__ import annotations

import copy

import pytest
import yaml

from sftprof.capture import config

from conftest import REPO, SMALL_DEMO


def validated(changes: dict | None = None) -> dict:
    cfg = copy.deepcopy(SMALL_DEMO)
    for dotted, value in (changes or {}).items():
        *parents, last = dotted.split(".")
        node = cfg
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return config.validate(cfg)


def test_repo_config_is_valid_and_defaults_are_filled():
    cfg = config.load(REPO / "config.yaml")
    demo = cfg["experiments"]["demo"]
    assert demo["sft"]["backend"] == "torch"
    assert demo["data"]["split"] == {"training": 0.80, "validation": 0.15, "test": 0.05}
    assert demo["profile"]["output_name"] == "profile"
    assert demo["profile"]["windows"]["steady"]["capture_range_end"] == "stop"


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"experiments.demo.sft.stepz": 3}, "stepz"),
        ({"experiments.demo.sft.steps": "ten"}, "experiments.demo.sft.steps"),
        ({"experiments.demo.sft.steps": 0}, "experiments.demo.sft.steps"),
        ({"experiments.demo.sft.steps": 16.0}, "experiments.demo.sft.steps"),
        ({"experiments.demo.slurm.nodes": 1.0}, "experiments.demo.slurm.nodes"),
        (
            {"experiments.demo.profile.windows.steady": {"duration_s": 0}},
            "experiments.demo.profile.windows.steady.duration_s",
        ),
        (
            {"experiments.demo.profile.windows.steady": {"delay_s": -5}},
            "experiments.demo.profile.windows.steady.delay_s",
        ),
        ({"experiments.demo.profile.trace": ["osrt", "cudaa"]}, "experiments.demo.profile.trace"),
        ({"experiments.demo.profile.windows.steady.end_step": 1}, "experiments.demo.profile.windows.steady.end_step"),
        ({"experiments.demo.profile.windows.steady.end_step": 6}, "experiments.demo.profile.windows.steady.end_step"),
        ({"experiments.demo.profile.trace": ["osrt"]}, "experiments.demo.profile.windows.steady.capture_range"),
        (
            {"experiments.demo.profile.windows.steady.capture_range": "cudaProfilerApi"},
            "experiments.demo.profile.windows.steady.capture_range",
        ),
        ({"experiments.demo.model": {"hidden_size": 30, "num_heads": 4}}, "experiments.demo.model.hidden_size"),
        ({"run": ["nope"]}, "run"),
    ],
)
def test_bad_values_name_their_key(changes, key):
    with pytest.raises(config.ConfigError) as error:
        validated(changes)
    assert f"config key {key}" in str(error.value) or key in str(error.value)


def test_unknown_key_is_quoted_in_the_message():
    with pytest.raises(config.ConfigError, match=r"experiments\.demo\.sft: unknown key\(s\) 'stepz'"):
        validated({"experiments.demo.sft.stepz": 3})


def test_unsafe_names_are_rejected_before_they_reach_a_path():
    cfg = copy.deepcopy(SMALL_DEMO)
    cfg["experiments"]["demo"]["profile"]["windows"] = {"../etc": {}}
    with pytest.raises(config.ConfigError, match="windows"):
        config.validate(cfg)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.load(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiments: [unclosed\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(bad)
    bad.write_text(yaml.safe_dump(["a", "list"]))
    with pytest.raises(config.ConfigError, match="mapping"):
        config.load(bad)


def test_time_window_accepts_delay_and_duration():
    window = validated({"experiments.demo.profile.windows.steady": {"delay_s": 2, "duration_s": 5}})["experiments"][
        "demo"
    ]["profile"]["windows"]["steady"]
    assert window == {
        "delay_s": 2,
        "duration_s": 5,
        "capture_range": "none",
        "capture_range_end": "stop",
        "op_ranges": False,
        "kill": "none",
    }


def test_op_ranges_are_a_windows_key_for_a_cuda_step_window():
    """emit_nvtx's op ranges cost the window they are in (docs/PROFILING-OVERHEAD.md), so they are asked for per
    window, where a short one can carry them beside the window that is timed; they need steps, CUDA and nvtx."""
    cuda = {"experiments.demo.sft.device": "cuda", "experiments.demo.profile.trace": ["cuda", "nvtx"]}
    ops = {"capture_range": "cudaProfilerApi", "start_step": 2, "end_step": 2, "op_ranges": True}
    windows = validated({**cuda, "experiments.demo.profile.windows.ops": ops})["experiments"]["demo"]["profile"]
    assert windows["windows"]["ops"]["op_ranges"] is True and windows["windows"]["steady"]["op_ranges"] is False
    for changes, said in (
        ({"experiments.demo.profile.windows.steady.op_ranges": True}, "need CUDA, sft.device is cpu"),
        ({**cuda, "experiments.demo.profile.windows.ops": {"delay_s": 1, "op_ranges": True}}, "need a step window"),
        ({**cuda, "experiments.demo.profile.trace": ["cuda"], "experiments.demo.profile.windows.ops": ops}, "'nvtx'"),
    ):
        with pytest.raises(config.ConfigError, match=said):
            validated(changes)


def test_the_default_trace_is_the_measured_one_and_opens_a_cuda_window():
    """Without `profile.trace`, a GPU experiment traces cuda, nvtx and osrt (docs/PROFILING-OVERHEAD.md, "What
    the defaults are"), so a cudaProfilerApi window, which needs cuda traced, validates."""
    cfg = copy.deepcopy(SMALL_DEMO)
    demo = cfg["experiments"]["demo"]
    del demo["profile"]["trace"]
    demo["sft"]["device"] = "cuda"
    demo["profile"]["windows"] = {"steady": {"capture_range": "cudaProfilerApi", "start_step": 1, "end_step": 2}}
    profile = config.validate(cfg)["experiments"]["demo"]["profile"]
    assert profile["trace"] == ["cuda", "nvtx", "osrt"]


def test_a_key_that_moved_says_where_it_is_now():
    with pytest.raises(config.ConfigError, match=r"sft\.nemo: unknown key\(s\) 'op_ranges'; .*profile\.windows\.NAME"):
        validated({"experiments.demo.sft.backend": "nemo", "experiments.demo.sft.nemo.op_ranges": True})
