"""The field's own checks, held in CI: ruff (lint and format, the rule set in pyproject.toml), snakefmt,
Snakemake's linter on the workflow, and the direction of imports between the package's parts."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "argv",
    [
        ["ruff", "check", "--no-cache", "."],
        ["ruff", "format", "--check", "--no-cache", "."],
        ["snakefmt", "--check", "workflow"],
    ],
    ids=["ruff-check", "ruff-format", "snakefmt"],
)
def test_tool_passes(argv):
    result = subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_mypy_passes():
    """The package type-checks at the strictness pyproject.toml's [tool.mypy] states."""
    if not (BIN / "mypy").exists():
        pytest.skip("mypy is not installed: pip install -e '.[test]'")
    result = subprocess.run([str(BIN / "mypy")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_snakemake_lint_is_clean():
    result = subprocess.run(
        [str(BIN / "snakemake"), "--lint", "-s", "workflow/Snakefile"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0 and "Congratulations" in result.stdout + result.stderr, result.stdout[-3000:]


# What each part of the package may not import, lazily inside a function or not: capture produces a capture,
# trace reads one, analysis computes on what trace read, report writes what analysis computed; pipeline
# chains them all, so none of them imports it.
FORBIDDEN_IMPORTS = {
    "capture": {"trace", "analysis", "report", "pipeline"},
    "trace": {"capture", "analysis", "report", "pipeline"},
    "analysis": {"capture", "report", "pipeline"},
    "report": {"pipeline"},
}


def _imported_parts(path: Path) -> set[str]:
    """The parts of sftprof (its first-level modules and packages) a file imports."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        parts |= {name.split(".")[1] for name in names if name.startswith("sftprof.")}
    return parts


def test_imports_point_one_way():
    wrong = [
        f"{path.relative_to(REPO)} imports sftprof.{part}"
        for side, forbidden in FORBIDDEN_IMPORTS.items()
        for path in sorted((REPO / "sftprof" / side).rglob("*.py"))
        for part in sorted(_imported_parts(path) & forbidden)
    ]
    assert not wrong, wrong


def _module_of(path: Path) -> str:
    """The dotted name of a module file of the package (a package's __init__.py: the package)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Which of `modules` a file imports, lazily inside a function or not (`from a.b import c` names module a.b.c
    where it is one, else a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                for alias in node.names
            ]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def _trace_imports() -> dict[str, set[str]]:
    """Each module of sftprof.trace -> the modules of sftprof.trace it imports."""
    paths = sorted((REPO / "sftprof" / "trace").rglob("*.py"))
    modules = {_module_of(path) for path in paths}
    return {_module_of(path): _imported_modules(path, modules) for path in paths}


def test_the_event_store_knows_no_trace_format():
    """The format-neutral store (events.py, tables.py) imports no reader of a format: trace/nsys imports it."""
    imports = _trace_imports()
    wrong = [
        f"{module} imports {imported}"
        for module in ("sftprof.trace.events", "sftprof.trace.tables")
        for imported in sorted(imports[module])
        if imported == "sftprof.trace.nsys" or imported.startswith("sftprof.trace.nsys.")
    ]
    assert not wrong, wrong


def test_no_import_cycle_among_trace_modules():
    imports = _trace_imports()
    done: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(imports[module]):
            found = cycle_from(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    cycles = sorted({" -> ".join(found) for module in sorted(imports) if (found := cycle_from(module, []))})
    assert not cycles, cycles
