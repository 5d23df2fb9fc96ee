"""Generated docs stay in step with what they are generated from, and the README's links resolve."""

import ast
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sftprof.capture import config_docs

REPO = Path(__file__).resolve().parent.parent


def test_config_reference_is_generated_from_the_schema():
    """docs/CONFIG.md is what `python -m sftprof.capture.config_docs` writes: regenerate it after a schema change."""
    assert (REPO / "docs" / "CONFIG.md").read_text() == config_docs.page()


def test_config_reference_lists_every_key_of_the_schema():
    page = config_docs.page()
    for key in (
        "experiments.NAME.sft.padding",
        "experiments.NAME.profile.windows.NAME.start_step",
        "experiments.NAME.variants.NAME.motivated_by",
        "remote.host",
        "experiments.NAME.slurm.partition",
    ):
        assert f"| `{key}` |" in page


def test_every_local_link_in_the_docs_resolves():
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"[a-z]+://", target):
                assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


# ---------------------------------------------------------------- the container recipe

RECIPE = REPO / "containers" / "sftprof-nemo.def"


def _recipe_sections() -> dict[str, list[str]]:
    """The recipe's %sections, each its lines; the header (comments and Bootstrap lines) under ""."""
    sections, name = {"": []}, ""
    for line in RECIPE.read_text().splitlines():
        if line.startswith("%"):
            name = line[1:].strip()
            sections[name] = []
        else:
            sections[name].append(line.strip())
    return sections


def _recipe_modules() -> list[str]:
    """The sftprof modules the recipe runs (`python -m NAME`) or imports (`python -c "import ..."`)."""
    text = RECIPE.read_text()
    names = re.findall(r"python -m (sftprof[\w.]*)", text)
    for code in re.findall(r'python -c "([^"]*)"', text):
        names += [
            alias.name for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Import) for alias in node.names
        ]
    return sorted({name for name in names if name.split(".")[0] == "sftprof"})


def test_the_container_recipe_names_modules_and_files_that_exist():
    """A module renamed or moved breaks an Apptainer build only at its %test, on a cluster: caught here."""
    modules = _recipe_modules()
    assert {"sftprof", "sftprof.capture.rank", "sftprof.capture.sft.nemo_backend"} <= set(modules)
    assert all(importlib.util.find_spec(name) is not None for name in modules), modules
    sources = [line.split()[0] for line in _recipe_sections()["files"] if line]
    assert sources and all((REPO / source).exists() for source in sources), sources


def test_the_container_recipes_imports_run_in_a_fresh_install_without_dependencies(tmp_path):
    """%files copies the package's sources and %post installs them with --no-deps over NeMo's image: here the same
    sources, copied as %files copies them, are installed so into a venv that holds nothing else (stricter than the
    image), and the recipe's sftprof imports must run there."""
    post = " ".join(_recipe_sections()["post"])
    assert re.search(r"pip install [^\n]*--no-deps /opt/sftprof", post), post
    source = tmp_path / "opt" / "sftprof"
    source.mkdir(parents=True)
    for line in filter(None, _recipe_sections()["files"]):
        origin, target = line.split()
        copy = shutil.copytree if (REPO / origin).is_dir() else shutil.copy
        copy(REPO / origin, source / Path(target).relative_to("/opt/sftprof"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    run = functools.partial(subprocess.run, check=True, env=env, capture_output=True, text=True, cwd=tmp_path)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", "dist", str(source)])
    run([sys.executable, "-m", "venv", "venv"])
    run(["venv/bin/pip", "install", "-q", "--no-deps", str(next((tmp_path / "dist").glob("sftprof-*.whl")))])
    code = f"import {', '.join(_recipe_modules())}; print(sftprof.__file__)"
    imported = run(["venv/bin/python", "-c", code], check=False)
    assert imported.returncode == 0 and str(tmp_path / "venv") in imported.stdout, imported.stderr[-2000:]


def test_the_overhead_tables_are_what_their_measurements_give():
    """docs/PROFILING-OVERHEAD.md's per-setting tables are overhead_table.py's output on the committed data each
    names in its marker."""
    sys.path.insert(0, str(REPO / "tests" / "gpu_programs"))
    import overhead_table

    page = (REPO / "docs" / "PROFILING-OVERHEAD.md").read_text()
    marked = re.findall(
        r"<!-- overhead table: python tests/gpu_programs/overhead_table.py (\S+) -->\n(.*?)<!-- end of overhead table -->",
        page,
        re.DOTALL,
    )
    assert sorted(path for path, _ in marked) == [
        f"tests/fixtures/overhead/h100_{name}.jsonl" for name in ("1b", "nemo_lora", "small")
    ]
    for path, shown in marked:
        lines = [json.loads(line) for line in (REPO / path).read_text().splitlines()]
        assert shown.strip() == overhead_table.table(lines).strip()
