"""The analysis registry: what analyze() saves is what the registry lists, and the docs page says so."""

import sys
from pathlib import Path

from sftprof.analysis import analyze
from sftprof.analysis.registry import RULES, SAVED_TABLES, SECTIONS, docs_page
from sftprof.trace.load import load_trace

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def test_docs_page_is_generated_from_the_registry():
    """docs/ANALYSES.md is what `python -m sftprof.analysis` writes today: regenerate it after changing the registry."""
    assert (REPO / "docs" / "ANALYSES.md").read_text() == docs_page()


def test_every_saved_table_and_rule_is_documented():
    page = docs_page()
    assert all(f"| `{name}` |" in page for name in SAVED_TABLES)
    assert all(f"| `{rule.name}` |" in page for rule in RULES)
    assert all(section.title for section in SECTIONS if section.saved)


def test_analysis_saves_exactly_the_registered_tables():
    progress = []
    result = analyze(load_trace(FIXTURES / "h200_plant_pageable.sqlite"), progress.append)
    assert list(result.tables) == list(SAVED_TABLES)
    assert progress == list(dict.fromkeys(section.stage for section in SECTIONS))


def test_every_entry_names_a_function_of_an_analysis_module():
    """No lambdas: the docs read each rule's own docstring, and a reader finds each value's code by its name."""
    for entry in [*(s.compute for s in SECTIONS), *(r.check for r in RULES)]:
        assert entry.__module__.startswith("sftprof.analysis."), entry
        assert getattr(sys.modules[entry.__module__], entry.__name__, None) is entry, entry
