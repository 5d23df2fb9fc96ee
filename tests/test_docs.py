"""Generated docs stay in step with what they are generated from, and the README's links resolve."""

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
