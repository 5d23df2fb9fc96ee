"""Hostile configs: the class "config" of the hostile-input tally (see tests/conftest.py).

Every input here is built to break loading, validation or a rendered job script. Two outcomes
are allowed: refused in one line (`sftprof: error: ...`, exit 1, nothing written), or a batch
script whose #SBATCH lines all come before the first command, that bash parses, and in which
every config value is one quoted word.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sftprof import cli
from sftprof.capture import config, jobs

from conftest import CONTROL_CHARACTERS, assert_refused, run_sftprof, tree_state

WINDOW = {"capture_range": "nvtx", "start_step": 4, "end_step": 7}
BASE = {"run": ["demo"], "experiments": {"demo": {"profile": {"windows": {"steady": WINDOW}}}}}
BASE_YAML = yaml.safe_dump(BASE, sort_keys=False)
DEEP = 5000


def under_demo(*lines: str) -> str:
    """BASE_YAML with `lines` added as keys of experiments.demo."""
    return BASE_YAML + "".join(f"    {line}\n" for line in lines)


def top_level(*lines: str) -> str:
    return BASE_YAML + "".join(f"{line}\n" for line in lines)


BILLION_LAUGHS = ['lol0: &lol0 "lol"'] + [f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * 10)}]" for i in range(1, 10)]

# id: (config file content, what the one-line error must name)
HOSTILE_YAML = {
    "float where an integer is wanted": (under_demo("sft: {steps: 16.0}"), "experiments.demo.sft.steps"),
    "float node count": (under_demo("slurm: {nodes: 1.0}"), "experiments.demo.slurm.nodes"),
    "NaN fraction": (under_demo("data: {split: {test: .nan}}"), "experiments.demo.data.split.test"),
    "NaN weight decay": (under_demo("sft: {weight_decay: .NaN}"), "experiments.demo.sft.weight_decay"),
    "infinity": (under_demo("sft: {learning_rate: .inf}"), "experiments.demo.sft.learning_rate"),
    "negative infinity": (under_demo("sft: {weight_decay: -.inf}"), "experiments.demo.sft.weight_decay"),
    "float overflow": (under_demo("sft: {learning_rate: 1.0e+999}"), "experiments.demo.sft.learning_rate"),
    "5000-digit integer": (under_demo(f"sft: {{steps: {'9' * DEEP}}}"), "experiments.demo.sft.steps"),
    "int64 max + 1": (under_demo("sft: {seed: 9223372036854775808}"), "experiments.demo.sft.seed"),
    "30-digit negative integer": (under_demo(f"sft: {{seed: -{'9' * 30}}}"), "experiments.demo.sft.seed"),
    "160-bit hex integer": (under_demo(f"sft: {{steps: 0x{'f' * 40}}}"), "experiments.demo.sft.steps"),
    "duplicate key": (under_demo("sft:", "  steps: 3", "  steps: 4"), "duplicate key 'steps'"),
    "duplicate key, flow": (under_demo("sft: {steps: 3, steps: 4}"), "experiments.demo.sft: duplicate key"),
    "duplicate key, quoted": (under_demo('sft: {steps: 3, "steps": 4}'), "duplicate key 'steps'"),
    "duplicate top-level key": (top_level("run: [other]"), "duplicate key 'run'"),
    "billion laughs": (top_level(*BILLION_LAUGHS), "anchors and aliases"),
    "anchor": (under_demo("sft: &sft {steps: 3}"), "experiments.demo.sft: YAML anchors and aliases"),
    "undefined alias": (under_demo("sft: *nowhere"), "anchors and aliases"),
    "merge key": (under_demo("sft: {<<: {steps: 3}}"), "merge keys"),
    "5000 nested mappings": (top_level(*(" " * i + f"k{i}:" for i in range(DEEP))), "nested deeper"),
    "5000 nested flow sequences": (top_level("deep: " + "[" * DEEP + "]" * DEEP), "nested deeper"),
    "5000 nested flow mappings": (top_level("deep: " + "{a: " * DEEP + "1" + "}" * DEEP), "nested deeper"),
    "escaped control character": (under_demo('data: {source: path, path: "/d\\x01"}'), "experiments.demo.data.path"),
    "NEL": (under_demo('slurm: {partition: "gh\\N"}'), "control character"),
    "tab in a path": (under_demo('model: {source: path, path: "/m\\tx"}'), "experiments.demo.model.path"),
    "terminal escape": (under_demo('container: {image_dir: "\\e[31mred"}'), "experiments.demo.container.image_dir"),
    "#SBATCH smuggled in a path": (
        under_demo('model: {source: path, path: "/m\\n#SBATCH --uid=0"}'),
        "control character",
    ),
    "raw control character": (under_demo("slurm: {partition: gh\x07}"), "not valid YAML"),
    "date": (under_demo("slurm: {partition: 2024-01-01}"), "experiments.demo.slurm.partition: a date"),
    "impossible date": (under_demo("slurm: {partition: 2024-13-45}"), "experiments.demo.slurm.partition"),
    "integer key": (under_demo("sft: {1: 2}"), "experiments.demo.sft: a key must be a string"),
    "binary": (under_demo("slurm: {partition: !!binary aGVsbG8=}"), "experiments.demo.slurm.partition"),
    "set": (under_demo("slurm: {partition: !!set {a}}"), "experiments.demo.slurm.partition"),
    "python object": (under_demo("slurm: {partition: !!python/object/apply:os.system [id]}"), "constructor"),
    "syntax error": (under_demo("sft: {steps: [3}"), "not valid YAML: line"),
    "second document": (top_level("---", "run: []"), "not valid YAML"),
    "option-like path": (
        under_demo("container: {runtime: apptainer, image_dir: --help}"),
        "experiments.demo.container.image_dir",
    ),
    ".sif image for docker": (under_demo("container: {runtime: docker, image: /x.sif}"), "docker runtime"),
    "not UTF-8": (BASE_YAML.encode() + b"    slurm: {partition: \xff}\n", "not UTF-8"),
}


def set_value(cfg: dict, field: str, value) -> dict:
    """`cfg` with `value` at `field` of its one experiment, or as the experiment's or window's name."""
    (experiment,) = cfg["experiments"].values()
    if field == "experiment":
        cfg["experiments"], cfg["run"] = {value: experiment}, [value]
    elif field == "window":
        experiment["profile"]["windows"] = {value: dict(WINDOW)}
    elif field == "run":
        cfg["run"] = [value]
    elif field == "remote.host":
        cfg["results_from"], cfg["remote"] = "remote", {"host": value, "workdir": "/w"}
    else:
        section, key = field.split(".")
        experiment.setdefault(section, {})[key] = [value] if key in ("binds", "extra", "env") else value
        if field == "model.path":
            experiment["model"]["source"] = "path"
    return cfg


def with_value(field: str, value) -> dict:
    return set_value(copy.deepcopy(BASE), field, value)


# Values each field's pattern accepts, to which a trailing newline is added.
PATTERN_FIELDS = {
    "experiment": "demo",
    "window": "steady",
    "slurm.partition": "gh",
    "slurm.time": "2:00:00",
    "slurm.mem": "64G",
    "slurm.extra": "--exclusive",
    "container.binds": "/data",
    "container.env": "HF_HOME",
    "container.image": "docker://nvcr.io/nvidia/nemo:25.02.01",
    "profile.output_name": "profile",
    "remote.host": "login1",
}
NEWLINE_CASES = {
    f"newline after {field}": (yaml.safe_dump(with_value(field, value + "\n")), "control character")
    for field, value in {**PATTERN_FIELDS, "run": "demo"}.items()
}


def cli_argv(command: str, config_file: Path, workdir: Path) -> list:
    if command == "validate":
        return ["validate", config_file]
    return [
        "render",
        "sbatch",
        "demo",
        "steady",
        "--config",
        config_file,
        "--workdir",
        workdir,
        "-o",
        workdir / "job.sbatch",
    ]


# Each case through one of the two commands, in turn: both load the config the same way.
HAND_CASES = [
    (command, *case)
    for command, case in zip(itertools.cycle(["validate", "render"]), [*HOSTILE_YAML.values(), *NEWLINE_CASES.values()])
]


@pytest.mark.ci_sample(25)
@pytest.mark.parametrize("command, content, named", HAND_CASES, ids=[*HOSTILE_YAML, *NEWLINE_CASES])
def test_hostile_config_file_is_refused_in_one_line(tmp_path, command, content, named):
    config_file = tmp_path / "config.yaml"
    if isinstance(content, bytes):
        config_file.write_bytes(content)
    else:
        config_file.write_text(content)
    before = tree_state(tmp_path)
    assert_refused(run_sftprof(*cli_argv(command, config_file, tmp_path), cwd=tmp_path), contains=named)
    assert tree_state(tmp_path) == before


def test_unreadable_config_file_is_refused_in_one_line(tmp_path):
    assert_refused(run_sftprof("validate", tmp_path, cwd=tmp_path), contains="cannot be read")


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_a_config_that_is_a_device_or_fifo_is_refused_at_once(tmp_path, capsys, kind):
    """Read with a limit and without blocking: a link to /dev/zero does not fill memory, a FIFO does not hang."""
    path = tmp_path / "config.yaml"
    path.symlink_to("/dev/zero") if kind == "/dev/zero" else os.mkfifo(path)
    assert cli.main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"sftprof: error: config file {path} cannot be read: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("field, value", PATTERN_FIELDS.items(), ids=list(PATTERN_FIELDS))
def test_the_schema_alone_refuses_a_trailing_newline(field, value):
    """Any jsonschema validator of the schema (snakemake's here, which uses re.search) refuses
    `value\\n`, not only sftprof's control-character check: the patterns end in \\Z."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    validate(with_value(field, value), str(config.SCHEMA_PATH))  # the value itself is fine
    with pytest.raises(WorkflowError, match="does not match"):
        validate(with_value(field, value + "\n"), str(config.SCHEMA_PATH))


def test_every_schema_pattern_ends_at_the_very_end():
    patterns = config.schema_patterns(yaml.safe_load(config.SCHEMA_PATH.read_text()))
    assert patterns, "the walk found no pattern"
    assert [p for p in patterns if not (p.startswith("^") and p.endswith("\\Z"))] == []


def test_a_pattern_ending_in_dollar_stops_every_load(tmp_path, monkeypatch):
    schema = tmp_path / "schema.yaml"
    schema.write_text(config.SCHEMA_PATH.read_text().replace('\\\\Z"', '$"', 1))
    monkeypatch.setattr(config, "SCHEMA_PATH", schema)
    with pytest.raises(RuntimeError, match="not to \\$"):
        config.load_schema()


@pytest.mark.parametrize("workdir", ["a\nb", "a b", "a$(id)b", "a\x1bb"])
@pytest.mark.parametrize("command", ["render", "submit"])
def test_working_directory_unfit_for_a_script_is_refused_and_nothing_written(tmp_path, command, workdir):
    (tmp_path / workdir).mkdir()
    config_file = tmp_path / "config.yaml"
    config_file.write_text(BASE_YAML)
    before = tree_state(tmp_path)
    argv = ["render", "sbatch", "-o", tmp_path / "job.sbatch"] if command == "render" else ["submit"]
    result = run_sftprof(
        *argv, "demo", "steady", "--config", config_file, "--workdir", tmp_path / workdir, cwd=tmp_path
    )
    assert_refused(result, contains="cannot carry")
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("container", "binds", ["/d\n#SBATCH --uid=0"]),
        ("container", "image_dir", "i\rj"),
        ("slurm", "partition", "gh\nid"),
        ("slurm", "partition", "g h"),
        ("slurm", "extra", ["--comment=$(id)"]),
        ("profile", "output_name", "p\x85q"),
    ],
)
def test_renderer_refuses_what_would_break_a_line_even_past_the_config(section, key, value):
    """The renderer's own guard, for a value that did not come through config.load."""
    demo = config.validate(with_value("container.runtime", "apptainer"))["experiments"]["demo"]
    demo[section][key] = value
    for render in (jobs.render_sbatch, jobs.render_salloc):
        with pytest.raises(jobs.SlurmError) as error:
            render("demo", demo, "steady", demo["profile"]["windows"]["steady"], "/w")
        assert "\n" not in str(error.value)


# --- property tests ----------------------------------------------------------------------------

# Shell syntax, quoting, control characters, option look-alikes and non-ASCII. Each is harmless
# if a shell ever ran it: PWNED would then stand where the text that names it should be.
FRAGMENTS = [
    "\n",
    "\r",
    "\t",
    "\x00",
    "\x1b[31m",
    "\x85",
    "\u2028",
    "\u202e",
    " ",
    "'",
    '"',
    "\\",
    "$(echo PWNED)",
    "`echo PWNED`",
    ";echo PWNED",
    "&&",
    "|",
    "&",
    "#",
    "*",
    "?",
    "[a]",
    "~",
    "!",
    "%",
    "-",
    "--x",
    "=",
    ":",
    ",",
    ".",
    "/",
    "${IFS}",
    "$HOME",
    "é",
    "名",
    "😀",
    "<x",
    ">x",
    "{a,b}",
]
# Starts that some field's pattern accepts, so that hostile endings get past the first character.
LEGAL_STARTS = ["", "gh", "1", "2:00:00", "64G", "/data", "--comment=", "docker://a/b", "HF_HOME"]
hostile_values = st.tuples(
    st.sampled_from(LEGAL_STARTS),
    st.one_of(st.lists(st.sampled_from(FRAGMENTS), max_size=4).map("".join), st.text(max_size=12)),
).map("".join)
FIELDS = [
    "experiment",
    "window",
    "run",
    "slurm.partition",
    "slurm.account",
    "slurm.qos",
    "slurm.constraint",
    "slurm.reservation",
    "slurm.time",
    "slurm.mem",
    "slurm.extra",
    "container.binds",
    "container.env",
    "container.image",
    "container.image_dir",
    "profile.output_name",
    "model.path",
]
RUNTIMES = ["none", "apptainer", "docker"]
PROPERTY_SETTINGS = settings(max_examples=120, deadline=None, database=None)


def hostile_config(values: dict, runtime: str) -> dict:
    cfg = with_value("container.runtime", runtime)
    for field in sorted(values, key=lambda field: field != "experiment"):  # a later `run` survives the rename
        set_value(cfg, field, values[field])
    return cfg


def render_in_process(cfg: dict, form: str, workdir: Path) -> subprocess.CompletedProcess:
    """`sftprof render FORM EXP WIN` through cli.main, in this process: as the command runs it,
    at a fraction of a subprocess's cost per example."""
    config_file = workdir / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    ((experiment_name, experiment),) = cfg["experiments"].items()
    (window_name,) = experiment["profile"]["windows"]
    argv = ["render", form, "--config", str(config_file), "--workdir", str(workdir), "--", experiment_name, window_name]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def assert_sound_script(text: str, form: str) -> None:
    """(a) #SBATCH lines before the first command, one option each; (b) bash parses it; and no
    control character but the line ends."""
    lines = text.split("\n")
    commands = [index for index, line in enumerate(lines) if line and not line.startswith("#")]
    directives = [index for index, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert commands and all(index < commands[0] for index in directives), text
    assert all(len(lines[index].split()) == 2 for index in directives), text
    assert bool(directives) == (form == "sbatch"), text
    assert not (CONTROL_CHARACTERS | {"\t"}) & set(text), repr(text)
    parsed = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert parsed.returncode == 0, parsed.stderr + text


def test_hostile_values_are_refused_in_one_line_or_render_a_sound_script(tmp_path, record_property):
    tried = 0

    @PROPERTY_SETTINGS
    @given(
        values=st.dictionaries(st.sampled_from(FIELDS), hostile_values, min_size=1, max_size=4),
        runtime=st.sampled_from(RUNTIMES),
    )
    def one_config(values, runtime):
        nonlocal tried
        tried += 1
        result = render_in_process(hostile_config(values, runtime), "sbatch", tmp_path)
        if result.returncode:
            assert_refused(result)
        else:
            assert_sound_script(result.stdout, "sbatch")

    try:
        one_config()
    finally:
        record_property("hostile_inputs", tried)


# Harmless fragments a marker ends in: shell syntax, most of it legal in some field (bind paths
# take all but `:`, `,` and spaces). No control characters (always refused, above) and no `/`
# (a path would normalise it away).
MARKER_ENDS = [
    "_",
    ".",
    "-",
    ",",
    ":",
    "+",
    "=",
    "@",
    "%",
    "[",
    "]",
    "&",
    "|",
    "*",
    "!",
    " ",
    "'",
    '"',
    "\\",
    "$(echo${IFS}PWNED)",
    "`echo${IFS}PWNED`",
    ";echo${IFS}PWNED",
    "$(echo PWNED)",
    "#",
    "~",
    "$HOME",
    "é",
    "<x",
    ">x",
    "?",
]
# field: (how a marker becomes its value, the runtimes under which it reaches the script)
MARKED_FIELDS = {
    "experiment": ("{}", RUNTIMES),
    "window": ("{}", RUNTIMES),
    "slurm.partition": ("{}", RUNTIMES),
    "slurm.account": ("{}", RUNTIMES),
    "slurm.qos": ("{}", RUNTIMES),
    "slurm.constraint": ("{}", RUNTIMES),
    "slurm.reservation": ("{}", RUNTIMES),
    "slurm.extra": ("--comment={}", RUNTIMES),
    "profile.output_name": ("{}", RUNTIMES),
    "model.path": ("/{}", RUNTIMES),
    "container.binds": ("/{}", ["apptainer", "docker"]),
    "container.image_dir": ("{}", ["apptainer"]),
    "container.image": ("docker://{}", ["docker"]),
    "container.env": ("{}", ["docker"]),
}


@st.composite
def marked_configs(draw) -> tuple[str, dict]:
    """A runtime and 1-3 fields, each holding a marker K<n>K plus hostile characters."""
    runtime = draw(st.sampled_from(RUNTIMES))
    fields = draw(
        st.lists(
            st.sampled_from([field for field, (_, runtimes) in MARKED_FIELDS.items() if runtime in runtimes]),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    ends = st.lists(st.sampled_from(MARKER_ENDS), max_size=3).map("".join)
    return runtime, {
        field: MARKED_FIELDS[field][0].format(f"K{index}K" + draw(ends)) for index, field in enumerate(fields)
    }


def json_strings(value) -> list[str]:
    if isinstance(value, dict):
        return [text for item in value.values() for text in json_strings(item)]
    return [value] if isinstance(value, str) else []


def words_of(text: str, workdir: Path) -> list[str]:
    """What the script hands to srun or salloc as bash parses it (both replaced by functions that
    print their arguments), the options of its #SBATCH lines, and the strings of its JSON argument."""
    script = workdir / "job.sh"
    script.write_text(text)
    stubs = 'srun() { printf "%s\\0" "$@"; }; salloc() { printf "%s\\0" "$@"; }; . "$1"'
    ran = subprocess.run(["bash", "-c", stubs, "bash", str(script)], cwd=workdir, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    argv = ran.stdout.split("\0")[:-1]
    words = argv + [line.split(" ", 1)[1] for line in text.split("\n") if line.startswith("#SBATCH ")]
    for arg in argv:
        with contextlib.suppress(ValueError):
            words += json_strings(json.loads(arg))
    return words


def test_every_value_reaches_the_script_as_one_quoted_word(tmp_path, record_property):
    tried = 0

    @PROPERTY_SETTINGS
    @given(marked=marked_configs())
    def one_config(marked):
        nonlocal tried
        tried += 1
        runtime, values = marked
        for form in ("sbatch", "salloc"):
            result = render_in_process(hostile_config(values, runtime), form, tmp_path)
            if result.returncode:
                assert_refused(result)
                return
            assert_sound_script(result.stdout, form)
            words = words_of(result.stdout, tmp_path)
            for field, value in values.items():
                marker = value.removeprefix("docker://")
                assert any(marker in word for word in words), (form, field, value, words)

    try:
        one_config()
    finally:
        record_property("hostile_inputs", tried)


@pytest.mark.parametrize("window", ["comparison", "variants", "suggested-variants.yaml", "variants.log"])
def test_a_window_named_like_an_output_of_the_workflow_is_refused(tmp_path, window):
    """Snakemake refuses such a config with a multi-line ChildIOException; validate says it in one line first."""
    config = copy.deepcopy(BASE)
    config["experiments"]["demo"]["profile"]["windows"] = {window: WINDOW}
    (path := tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert_refused(run_sftprof("validate", path), contains=f"profile.windows.{window}: a window may not be named")


@pytest.mark.parametrize("variant", ["model", "dolly.jsonl", "sft", "variants.log", "comparison", "steady"])
def test_a_variant_named_like_an_output_or_a_window_is_refused(tmp_path, variant):
    config = copy.deepcopy(BASE)
    config["experiments"]["demo"]["variants"] = {variant: {"sft": {"steps": 9}}}
    (path := tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert_refused(run_sftprof("validate", path), contains=f"variants.{variant}: a variant may not be named")


def test_every_log_the_rules_write_beside_the_windows_is_reserved():
    from sftprof import layout

    rules = "".join(path.read_text() for path in (Path(__file__).parent.parent / "workflow" / "rules").glob("*.smk"))
    written = set(re.findall(r"\{layout\.LOG_DIR\}/([^/{}\"]+)\"", rules))
    assert written and written <= set(layout.LOG_NAMES), written - set(layout.LOG_NAMES)
