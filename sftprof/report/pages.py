"""The one Jinja environment of every report page (report.html, ranks.html, compare.html, variants.html).

Autoescaping keeps names from the trace from acting as markup; `render` also writes every control
character that is left (ESC, NUL, bidirectional overrides from kernel, NVTX or file names, in tables and
plots too) as a visible escape, so that no page shows text reordered or hidden by them."""

from __future__ import annotations

import jinja2

from sftprof.analysis.findings import gain_text
from sftprof.text import page_safe

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("sftprof.report", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=jinja2.select_autoescape(["html", "j2"]),
)
_ENV.filters["gain"] = gain_text


def render(template: str, **context) -> str:
    """TEMPLATE rendered with CONTEXT, with no raw control character but the page's own line breaks."""
    return page_safe(_ENV.get_template(template).render(**context))
