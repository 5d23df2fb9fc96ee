"""Configuration: load config.yaml, validate it against the one schema, fill its defaults.

The JSON schema in workflow/schemas/ is the only place that lists keys, types and defaults.
This module adds the checks a schema cannot express (fields that depend on each other) and
turns validation failures into messages that name the offending key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from sftprof.errors import SftprofError

REPO_ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(SftprofError, ValueError):
    """A config value is wrong; the message names the key."""


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _validator_filling_defaults(schema: dict):
    """A validator for the schema's draft that also writes each missing property's `default`.

    Same behaviour as snakemake.utils.validate(set_default=True), so the CLI and the workflow
    see identical filled-in configs.
    """
    base = jsonschema.validators.validator_for(schema)
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if validator.is_type(instance, "object"):
            for name, subschema in properties.items():
                if "default" in subschema and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return f"unknown key(s) {', '.join(map(repr, unknown))}"
    return error.message


def validate(config: dict) -> dict:
    """Validate `config` in place (filling defaults) and return it; raise ConfigError."""
    schema = load_schema()
    validator = _validator_filling_defaults(schema)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise ConfigError(f"config key {_key_path(error)}: {_describe(error)}")
    check_cross_field_rules(config)
    return config


def load(path: str | Path) -> dict:
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return validate(config)


def check_cross_field_rules(config: dict) -> None:
    """Rules between fields that JSON schema cannot state; run after schema validation."""
    for name in config["run"]:
        if name not in config["experiments"]:
            raise ConfigError(f"config key run: experiment {name!r} is not defined under experiments")
    if config["results_from"] == "remote":
        remote_settings(config)
    for exp_name, exp in config["experiments"].items():
        where = f"experiments.{exp_name}"
        split = exp["data"]["split"]
        if abs(sum(split.values()) - 1.0) > 1e-9:
            raise ConfigError(f"config key {where}.data.split: fractions must add up to 1, got {sum(split.values())}")
        _check_data(where, exp["data"])
        _check_model(where, exp["model"], exp["sft"])
        sft = exp["sft"]
        _check_ranks(where, exp)
        trace = exp["profile"]["trace"]
        for win_name, window in exp["profile"]["windows"].items():
            _check_window(f"{where}.profile.windows.{win_name}", window, trace, sft)
    _check_shared_checkpoints(config)


def world_size(experiment: dict) -> int:
    slurm = experiment["slurm"]
    return slurm["nodes"] * slurm["ntasks_per_node"]


def _check_data(where: str, data: dict) -> None:
    if data["source"] == "path" and "path" not in data:
        raise ConfigError(f"config key {where}.data.path: data.source path needs a dolly jsonl file or URL")


def _check_model(where: str, model: dict, sft: dict) -> None:
    if model["source"] == "path":
        if "path" not in model:
            raise ConfigError(f"config key {where}.model.path: model.source path needs the checkpoint folder")
        return
    if model["source"] == "hub":
        return
    if model["hidden_size"] % model["num_heads"]:
        raise ConfigError(f"config key {where}.model.hidden_size: must be a multiple of num_heads")
    if model["num_heads"] % model["num_kv_heads"]:
        raise ConfigError(f"config key {where}.model.num_kv_heads: must divide num_heads")
    if sft["seq_length"] > model["max_position_embeddings"]:
        raise ConfigError(f"config key {where}.sft.seq_length: exceeds model.max_position_embeddings")


def _check_shared_checkpoints(config: dict) -> None:
    """Experiments that download into one checkpoint folder must want the same files of it:
    the folder has one manifest."""
    hub_models = {name: exp["model"] for name, exp in config["experiments"].items() if exp["model"]["source"] == "hub"}
    if not hub_models:
        return
    from sftprof import hub  # imports huggingface_hub: only when some experiment downloads

    first: dict[str, tuple[str, dict]] = {}
    for name, model in hub_models.items():
        folder, wanted = hub.checkpoint_dir(model), hub.model_identity(model)
        other, other_wanted = first.setdefault(folder, (name, wanted))
        if other_wanted != wanted:
            raise ConfigError(f"config key experiments.{name}.model: downloads {wanted} into {folder}, where "
                              f"experiment {other!r} downloads {other_wanted}; give one of them another model.dir")


def _check_ranks(where: str, exp: dict) -> None:
    ranks = world_size(exp)
    outside = [r for r in exp["profile"]["ranks"] if r >= ranks]
    if outside:
        raise ConfigError(f"config key {where}.profile.ranks: rank(s) {outside} do not exist; slurm.nodes x "
                          f"slurm.ntasks_per_node gives ranks 0..{ranks - 1}")
    if exp["sft"]["backend"] != "nemo":
        return
    nemo = exp["sft"]["nemo"]
    model_parallel = nemo["tensor_parallel"] * nemo["pipeline_parallel"]
    if ranks % model_parallel:
        raise ConfigError(f"config key {where}.sft.nemo: {ranks} ranks cannot be split into groups of "
                          f"tensor_parallel x pipeline_parallel = {model_parallel}")
    if exp["sft"]["device"] == "cpu":
        raise ConfigError(f"config key {where}.sft.device: the nemo backend trains on CUDA only")
    for win_name, window in exp["profile"]["windows"].items():
        if window["capture_range"] == "nvtx":
            raise ConfigError(f"config key {where}.profile.windows.{win_name}.capture_range: the nemo backend "
                              "opens step windows with NeMo's NsysCallback, i.e. cudaProfilerApi")


def _check_window(where: str, window: dict, trace: list[str], sft: dict) -> None:
    by_steps = window["capture_range"] != "none"
    has_steps = "start_step" in window or "end_step" in window
    has_time = "delay_s" in window or "duration_s" in window
    if by_steps:
        if "start_step" not in window or "end_step" not in window:
            raise ConfigError(f"config key {where}: capture_range {window['capture_range']} needs start_step and end_step")
        if has_time:
            raise ConfigError(f"config key {where}: a step window takes no delay_s/duration_s")
        if window["end_step"] < window["start_step"]:
            raise ConfigError(f"config key {where}.end_step: must not be before start_step")
        if window["end_step"] >= sft["steps"]:
            raise ConfigError(
                f"config key {where}.end_step: training runs steps 0..{sft['steps'] - 1}, "
                f"so the window never closes"
            )
    elif has_steps:
        raise ConfigError(f"config key {where}: start_step/end_step need capture_range nvtx or cudaProfilerApi")
    if window["capture_range"] == "nvtx" and "nvtx" not in trace:
        raise ConfigError(f"config key {where}.capture_range: nvtx needs 'nvtx' in profile.trace")
    if window["capture_range"] == "cudaProfilerApi":
        if "cuda" not in trace:
            raise ConfigError(f"config key {where}.capture_range: cudaProfilerApi needs 'cuda' in profile.trace")
        if sft["device"] == "cpu":
            raise ConfigError(f"config key {where}.capture_range: cudaProfilerApi needs a CUDA device, sft.device is cpu")


def experiment(config: dict, name: str) -> dict[str, Any]:
    try:
        return config["experiments"][name]
    except KeyError:
        known = ", ".join(sorted(config["experiments"]))
        raise ConfigError(f"unknown experiment {name!r}; config defines: {known}") from None


def window(config: dict, experiment_name: str, window_name: str) -> dict[str, Any]:
    windows = experiment(config, experiment_name)["profile"]["windows"]
    try:
        return windows[window_name]
    except KeyError:
        known = ", ".join(sorted(windows))
        raise ConfigError(f"experiment {experiment_name!r} has no window {window_name!r}; it has: {known}") from None


def remote_settings(config: dict) -> dict:
    """The `remote` section, or a ConfigError saying how to add one."""
    if "remote" not in config:
        raise ConfigError("config key remote: not set; add `remote: {host: LOGIN_NODE, workdir: PATH}` "
                          "(the cluster working directory that holds results/)")
    return config["remote"]
