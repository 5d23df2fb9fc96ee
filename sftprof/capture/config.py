"""Configuration: load config.yaml, validate it against the one schema, fill its defaults.

The JSON schema beside this module (config.schema.yaml, shipped as package data) is the only place that lists keys, types and defaults.
This module adds the checks a schema cannot express (fields that depend on each other, YAML
features and values no key may hold) and turns failures into one-line messages that name the
offending key.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from sftprof import layout, memory_budget
from sftprof.errors import SftprofError, shown
from sftprof.io import InputError, read_limited
from sftprof.step_names import step_pattern
from sftprof.untrusted import CONTROL_CHARACTER

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")  # package data: a wheel validates too


class ConfigError(SftprofError, ValueError):
    """A config value is wrong; the message names the key."""


# Deeper than any config needs, far shallower than Python's recursion limit.
MAX_DEPTH = 32
MAX_CONFIG_BYTES = 16 * 2**20  # a config is a few kilobytes; this bounds what a link to /dev/zero reads
INT64 = range(-(2**63), 2**63)
# jsonschema's `pattern` is re.search, and `$` also matches before a final newline.
ANCHORED_PATTERN = re.compile(r"\^.*\\Z", re.DOTALL)


def load_schema() -> dict:
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    unanchored = [pattern for pattern in schema_patterns(schema) if not ANCHORED_PATTERN.fullmatch(pattern)]
    if unanchored:
        raise RuntimeError(f"{SCHEMA_PATH}: every pattern must run from ^ to \\Z, not to $: {unanchored}")
    return schema


def schema_patterns(schema) -> list[str]:
    """Every `pattern` of the schema, at any depth."""
    if isinstance(schema, list):
        return [pattern for item in schema for pattern in schema_patterns(item)]
    if not isinstance(schema, dict):
        return []
    own = [schema["pattern"]] if isinstance(schema.get("pattern"), str) else []
    return own + [pattern for value in schema.values() for pattern in schema_patterns(value)]


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

    # jsonschema takes 16.0 for an integer; a float where a count is wanted would reach the
    # trainer, or an #SBATCH line as --nodes=1.0.
    integers_only = base.TYPE_CHECKER.redefine(
        "integer", lambda checker, instance: isinstance(instance, int) and not isinstance(instance, bool)
    )
    return jsonschema.validators.extend(base, {"properties": set_defaults}, type_checker=integers_only)


def _dotted(parts) -> str:
    """A key path for a one-line message: parts that would not print as themselves are repr()ed."""
    texts = [str(part) if str(part).isprintable() else repr(part) for part in parts]
    return ".".join(texts) or "<top level>"


# Keys that moved, with where they are now: a config written for the old place gets told.
MOVED_KEYS = {"sft.nemo.op_ranges": "op_ranges is a window's key now (profile.windows.NAME.op_ranges)"}


def _key_path(error: jsonschema.ValidationError) -> str:
    return _dotted(error.absolute_path)


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        here = _dotted(error.absolute_path)
        moved = [told for old, told in MOVED_KEYS.items() for key in unknown if f"{here}.{key}".endswith(old)]
        return f"unknown key(s) {', '.join(map(repr, unknown))}" + "".join(f"; {where}" for where in moved)
    return error.message


def check_plain_values(value, path: tuple = ()) -> None:
    """Refuse what YAML can hold but no config value may: keys that are not strings, control
    characters, NaN and infinities (every bound check passes them), integers beyond int64, and
    types JSON has not (dates, sets, bytes)."""
    where = f"config key {_dotted(path)}"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where}: a key must be a string, not {type(key).__name__}; quote it")
            check_plain_values(key, path)
            check_plain_values(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_plain_values(item, (*path, index))
    elif isinstance(value, str):
        if CONTROL_CHARACTER.search(value):
            raise ConfigError(f"{where}: {shown(value)} holds a control character (a newline, tab...)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {value} is not a finite number")
    elif isinstance(value, int):
        if value not in INT64:
            raise ConfigError(f"{where}: a {value.bit_length()}-bit integer is beyond the 64-bit range")
    elif value is not None:
        raise ConfigError(
            f"{where}: a value of type {type(value).__name__} is not allowed; quote it to make it a string"
        )


def validate(config: dict) -> dict:
    """Validate `config` in place (filling defaults) and return it; raise ConfigError."""
    check_plain_values(config)
    schema = load_schema()
    validator = _validator_filling_defaults(schema)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise ConfigError(f"config key {_key_path(error)}: {_describe(error)}")
    _expand_variants(config, schema)
    check_cross_field_rules(config)
    return config


def _names_in(folder: str) -> set[str]:
    """The fixed names the workflow writes in `folder` (a layout pattern), besides windows and variants."""
    patterns = [value for value in vars(layout).values() if isinstance(value, str) and value.startswith(folder + "/")]
    return {part for part in (p[len(folder) + 1 :].split("/")[0] for p in patterns) if "{" not in part}


# What a window or variant may not be named: a window has a folder in results/EXPERIMENT/ and logs/EXPERIMENT/, a
# variant in those and in resources/EXPERIMENT/, beside the workflow's own outputs (Snakemake refuses the clash).
RESERVED_WINDOW_NAMES = _names_in(layout.WINDOW_DIR.rsplit("/", 1)[0]) | set(layout.LOG_NAMES)
RESERVED_VARIANT_NAMES = RESERVED_WINDOW_NAMES | _names_in(layout.DOLLY_JSONL.rsplit("/", 1)[0])


def _merged(base, overrides):
    """`base` with `overrides` merged into it key by key (mappings recursively; other values replaced)."""
    if not isinstance(base, dict) or not isinstance(overrides, dict):
        return copy.deepcopy(overrides)
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        merged[key] = _merged(base.get(key), value)
    return merged


def _experiment_validator(schema: dict):
    experiment_schema = {**schema, **schema["definitions"]["experiment"]}
    return _validator_filling_defaults(experiment_schema)(experiment_schema)


# An experiment's own keys that its variants do not inherit.
NOT_INHERITED = ("variants", "suggested_variants")


def _add_variant(config: dict, name: str, variant: str, overrides: dict, validator) -> None:
    """Add experiment `name` with the variant's overrides merged in as NAME/VARIANT, checked against the
    experiment schema (defaults filled), so that every rule and check treats a variant as the experiment it is."""
    base = {key: value for key, value in config["experiments"][name].items() if key not in NOT_INHERITED}
    where = f"experiments.{name}.variants.{variant}"
    if variant in RESERVED_VARIANT_NAMES or variant in base["profile"]["windows"]:
        raise ConfigError(
            f"config key {where}: a variant may not be named like a window or what the workflow writes beside "
            f"its folders ({', '.join(sorted(RESERVED_VARIANT_NAMES))})"
        )
    merged = _merged(base, {key: value for key, value in overrides.items() if key != "motivated_by"})
    errors = sorted(validator.iter_errors(merged), key=lambda e: list(e.absolute_path))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise ConfigError(f"config key {where}.{_key_path(error)}: {_describe(error)}")
    config["experiments"][f"{name}/{variant}"] = merged


def _expand_variants(config: dict, schema: dict) -> None:
    """Add each experiment's variants to `experiments` as EXPERIMENT/VARIANT. Repeatable: a second call
    rebuilds them."""
    validator = _experiment_validator(schema)
    experiments = config["experiments"]
    for name in [name for name in experiments if "/" not in name]:
        for variant, overrides in experiments[name].get("variants", {}).items():
            _add_variant(config, name, variant, overrides, validator)


def suggested_variant_count(config: dict, name: str) -> int:
    """How many variants the workflow adds to experiment `name` from its baseline's findings (0: switched off)."""
    setting = config["experiments"][name].get("suggested_variants", {})
    return setting["top"] if setting.get("enabled") else 0


def add_suggested_variants(config: dict, name: str, suggested: dict[str, dict]) -> None:
    """Add the variants `sftprof suggest` gave for experiment `name` (known only once its baseline is
    analysed) as if they were written in the config; a hand-written variant of the same name wins."""
    variants = config["experiments"][name].setdefault("variants", {})
    validator = _experiment_validator(load_schema())
    for variant, overrides in suggested.items():
        if variant not in variants:
            variants[variant] = overrides
            _add_variant(config, name, variant, overrides, validator)


def variants_of(config: dict, name: str) -> dict[str, dict]:
    """The variants of experiment `name` (overrides and motivated_by), by name: those written in the config,
    and the suggested ones once added."""
    return config["experiments"][name].get("variants", {})


def built_experiments(config: dict) -> list[str]:
    """What `snakemake` builds: each experiment of `run`, and its variants after it."""
    return [full for name in config["run"] for full in (name, *(f"{name}/{v}" for v in variants_of(config, name)))]


class _Refused(yaml.MarkedYAMLError):
    """YAML that PyYAML reads but StrictLoader does not."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses what it would otherwise read silently or crash on: duplicate keys
    (the last one would win), anchors, aliases and merge keys (an alias bomb expands to
    gigabytes), nesting deeper than MAX_DEPTH, integers too long for int() and dates (both
    raise ValueError). Each refusal names the key and its line."""

    def __init__(self, stream):
        super().__init__(stream)
        self._path: list = []  # per node being composed: its key, its index, or None (a key, the root)

    def compose_node(self, parent, index):
        """PyYAML's compose_node (index: the key node of a mapping value, the index of a sequence
        item), with the key path kept for messages and each node checked as it is read."""
        event = self.peek_event()
        self._path.append(
            index.value if isinstance(index, yaml.ScalarNode) else "?" if isinstance(index, yaml.Node) else index
        )
        try:
            if isinstance(event, yaml.AliasEvent) or event.anchor is not None:
                raise self._refusal(event.start_mark, "YAML anchors and aliases are not allowed; write the value out")
            if len(self._path) > MAX_DEPTH:
                raise self._refusal(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
            node = super().compose_node(parent, index)
            self._check(node)
        finally:
            self._path.pop()
        return node

    def _check(self, node) -> None:
        if isinstance(node, yaml.MappingNode):
            first_of = {}
            for key, _ in node.value:
                if key.tag == "tag:yaml.org,2002:merge":
                    raise self._refusal(key.start_mark, "merge keys (<<) are not allowed; write the keys out")
                first = first_of.setdefault((key.tag, key.value), key) if isinstance(key, yaml.ScalarNode) else key
                if first is not key:
                    mark = first.start_mark
                    raise self._refusal(
                        key.start_mark,
                        f"duplicate key {shown(key.value)} (first at line {mark.line + 1}, column {mark.column + 1})",
                    )
        elif node.tag == "tag:yaml.org,2002:timestamp":
            raise self._refusal(node.start_mark, "a date is not a config value; quote it to make it a string")
        elif node.tag == "tag:yaml.org,2002:int":
            try:
                self.construct_yaml_int(node)
            except ValueError:
                raise self._refusal(
                    node.start_mark, f"an integer of {len(node.value)} characters is beyond the 64-bit range"
                ) from None

    def _refusal(self, mark, problem: str) -> _Refused:
        where = _dotted(part for part in self._path if part is not None)
        return _Refused(problem=f"config key {where}: {problem}", problem_mark=mark)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's message in one line (its own spans several, with the offending text quoted)."""
    if isinstance(error, yaml.reader.ReaderError):
        return f"character #x{error.character:04x} at offset {error.position}: {error.reason}"
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return " ".join(str(error).split())
    what = "; ".join(filter(None, (error.context, error.problem)))
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}"


def load(path: str | Path) -> dict:
    """The config file at `path`, read strictly and validated, with defaults filled in."""
    return validate(read(path))


def read(path: str | Path) -> dict:
    """The mapping in the config file at `path`, read by StrictLoader but not yet validated
    (the workflow validates what Snakemake merged from its config files and --config)."""
    path = Path(path)
    try:
        text = read_limited(path, MAX_CONFIG_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except InputError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.reason}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        config = yaml.load(text, Loader=StrictLoader)
    except _Refused as exc:
        raise ConfigError(f"config file {path}, line {exc.problem_mark.line + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return config


def check_cross_field_rules(config: dict) -> None:
    """Rules between fields that JSON schema cannot state; run after schema validation."""
    for name in config["run"]:
        if name not in config["experiments"]:
            raise ConfigError(f"config key run: experiment {name!r} is not defined under experiments")
    if config.get("step_range") is not None:
        try:
            step_pattern(config["step_range"])
        except SftprofError as error:
            raise ConfigError(f"config key step_range: {error}") from None
    try:
        memory_budget.parse(config["memory_budget"])
    except memory_budget.MemoryBudgetError as error:
        raise ConfigError(f"config key memory_budget: {error}") from None
    if config["results_from"] == "remote":
        remote_settings(config)
    for exp_name, exp in config["experiments"].items():
        where = f"experiments.{exp_name}"
        split = exp["data"]["split"]
        if abs(sum(split.values()) - 1.0) > 1e-9:
            raise ConfigError(f"config key {where}.data.split: fractions must add up to 1, got {sum(split.values())}")
        _check_data(where, exp["data"])
        _check_model(where, exp["model"], exp["sft"])
        _check_container(where, exp["container"])
        sft = exp["sft"]
        _check_ranks(where, exp)
        trace = exp["profile"]["trace"]
        for win_name, window in exp["profile"]["windows"].items():
            if win_name in RESERVED_WINDOW_NAMES:
                raise ConfigError(
                    f"config key {where}.profile.windows.{win_name}: a window may not be named like what the "
                    f"workflow writes beside its folders ({', '.join(sorted(RESERVED_WINDOW_NAMES))})"
                )
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
    if model["source"] == "random":
        from sftprof.capture.model import ARCHITECTURES

        if model["architecture"] not in ARCHITECTURES:
            raise ConfigError(
                f"config key {where}.model.architecture: {model['architecture']!r} is not offered; "
                f"choose one of {', '.join(ARCHITECTURES)}"
            )
        if sft["seq_length"] > ARCHITECTURES[model["architecture"]]["hf"]["max_position_embeddings"]:
            raise ConfigError(
                f"config key {where}.sft.seq_length: exceeds {model['architecture']}'s max_position_embeddings"
            )
        return
    if model["hidden_size"] % model["num_heads"]:
        raise ConfigError(f"config key {where}.model.hidden_size: must be a multiple of num_heads")
    if model["num_heads"] % model["num_kv_heads"]:
        raise ConfigError(f"config key {where}.model.num_kv_heads: must divide num_heads")
    if sft["seq_length"] > model["max_position_embeddings"]:
        raise ConfigError(f"config key {where}.sft.seq_length: exceeds model.max_position_embeddings")


def _check_container(where: str, container: dict) -> None:
    if container["runtime"] == "docker" and not container["image"].startswith("docker://"):
        raise ConfigError(f"config key {where}.container.image: the docker runtime runs docker:// images only")


def _check_shared_checkpoints(config: dict) -> None:
    """Experiments that download into one checkpoint folder must want the same files of it:
    the folder has one manifest."""
    hub_models = {name: exp["model"] for name, exp in config["experiments"].items() if exp["model"]["source"] == "hub"}
    if not hub_models:
        return
    from sftprof.capture import hub  # imports huggingface_hub: only when some experiment downloads

    first: dict[str, tuple[str, dict]] = {}
    for name, model in hub_models.items():
        folder, wanted = hub.checkpoint_dir(model), hub.model_identity(model)
        other, other_wanted = first.setdefault(folder, (name, wanted))
        if other_wanted != wanted:
            raise ConfigError(
                f"config key experiments.{name}.model: downloads {wanted} into {folder}, where "
                f"experiment {other!r} downloads {other_wanted}; give one of them another model.dir"
            )


def _check_ranks(where: str, exp: dict) -> None:
    ranks = world_size(exp)
    outside = [r for r in exp["profile"]["ranks"] if r >= ranks]
    if outside:
        raise ConfigError(
            f"config key {where}.profile.ranks: rank(s) {outside} do not exist; slurm.nodes x "
            f"slurm.ntasks_per_node gives ranks 0..{ranks - 1}"
        )
    if exp["sft"]["backend"] != "nemo":
        return
    nemo = exp["sft"]["nemo"]
    model_parallel = nemo["tensor_parallel"] * nemo["pipeline_parallel"]
    if ranks % model_parallel:
        raise ConfigError(
            f"config key {where}.sft.nemo: {ranks} ranks cannot be split into groups of "
            f"tensor_parallel x pipeline_parallel = {model_parallel}"
        )
    if exp["sft"]["device"] == "cpu":
        raise ConfigError(f"config key {where}.sft.device: the nemo backend trains on CUDA only")
    if nemo["overlap_param_gather"] and nemo["peft"] != "none":
        raise ConfigError(
            f"config key {where}.sft.nemo.overlap_param_gather: LoRA runs without the distributed optimizer, "
            "so there is no parameter gather to overlap"
        )
    for win_name, window in exp["profile"]["windows"].items():
        if window["capture_range"] == "nvtx":
            raise ConfigError(
                f"config key {where}.profile.windows.{win_name}.capture_range: the nemo backend "
                "opens step windows with NeMo's NsysCallback, i.e. cudaProfilerApi"
            )


def _check_window(where: str, window: dict, trace: list[str], sft: dict) -> None:
    by_steps = window["capture_range"] != "none"
    has_steps = "start_step" in window or "end_step" in window
    has_time = "delay_s" in window or "duration_s" in window
    if by_steps:
        if "start_step" not in window or "end_step" not in window:
            raise ConfigError(
                f"config key {where}: capture_range {window['capture_range']} needs start_step and end_step"
            )
        if has_time:
            raise ConfigError(f"config key {where}: a step window takes no delay_s/duration_s")
        if window["end_step"] < window["start_step"]:
            raise ConfigError(f"config key {where}.end_step: must not be before start_step")
        if window["end_step"] >= sft["steps"]:
            raise ConfigError(
                f"config key {where}.end_step: training runs steps 0..{sft['steps'] - 1}, so the window never closes"
            )
    elif has_steps:
        raise ConfigError(f"config key {where}: start_step/end_step need capture_range nvtx or cudaProfilerApi")
    if window["capture_range"] == "nvtx" and "nvtx" not in trace:
        raise ConfigError(f"config key {where}.capture_range: nvtx needs 'nvtx' in profile.trace")
    if window["op_ranges"]:
        if not by_steps:
            raise ConfigError(f"config key {where}.op_ranges: op ranges need a step window (capture_range)")
        if sft["device"] == "cpu":
            raise ConfigError(f"config key {where}.op_ranges: emit_nvtx's op ranges need CUDA, sft.device is cpu")
        if "nvtx" not in trace:
            raise ConfigError(f"config key {where}.op_ranges: op ranges need 'nvtx' in profile.trace")
    if window["capture_range"] == "cudaProfilerApi":
        if "cuda" not in trace:
            raise ConfigError(f"config key {where}.capture_range: cudaProfilerApi needs 'cuda' in profile.trace")
        if sft["device"] == "cpu":
            raise ConfigError(
                f"config key {where}.capture_range: cudaProfilerApi needs a CUDA device, sft.device is cpu"
            )


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
        raise ConfigError(
            "config key remote: not set; add `remote: {host: LOGIN_NODE, workdir: PATH}` "
            "(the cluster working directory that holds results/)"
        )
    return config["remote"]
