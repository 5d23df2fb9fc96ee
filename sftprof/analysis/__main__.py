"""`python -m sftprof.analysis > docs/ANALYSES.md`: the page of analyses and rules, from the registry."""

import sys

from sftprof.analysis.registry import docs_page

sys.stdout.write(docs_page())
