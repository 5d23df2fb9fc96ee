"""Generated docs stay in step with what they are generated from, and the README's links resolve."""

import json
import re
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


def test_the_overhead_table_is_what_its_measurements_give():
    """docs/PROFILING-OVERHEAD.md's per-setting table is overhead_table.py's output on the committed data."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "gpu_programs"))
    import overhead_table

    lines = [json.loads(line) for line in (REPO / "tests/fixtures/overhead/h100_small.jsonl").read_text().splitlines()]
    page = (REPO / "docs" / "PROFILING-OVERHEAD.md").read_text()
    shown = page.split("-->\n", 1)[1].split("<!-- end of overhead table -->")[0]
    assert shown.strip() == overhead_table.table(lines).strip()
