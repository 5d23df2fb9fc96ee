"""docs/CONFIG.md, the configuration reference, written from the schema (the one place that lists
keys, types and defaults): `python -m sftprof.capture.config_docs > docs/CONFIG.md`. A test keeps
the page in step with the schema."""

from __future__ import annotations

import json
import sys

from sftprof.capture.config import load_schema

INTRO = """# Configuration reference

What you can do with this page: look up any key of `config.yaml`, its type, its default and what
it does. It is generated from `sftprof/capture/config.schema.yaml`, which Snakemake and
`sftprof validate` check every config against (`python -m sftprof.capture.config_docs >
docs/CONFIG.md`; a test keeps it in sync). Keys are written as paths: `experiments.NAME.sft.steps`
is the `steps` key of the `sft` section of the experiment called NAME.
"""


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = {
            **schema["definitions"][node["$ref"].rsplit("/", 1)[-1]],
            **{k: v for k, v in node.items() if k != "$ref"},
        }
    return node


def _kind(schema: dict, node: dict) -> str:
    node = _resolve(schema, node)
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    kind = node.get("type", "")
    if kind == "array" and "items" in node:
        return f"list of {_kind(schema, node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict) and not node.get("properties"):
        return "mapping of name to the section below"
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _rows(schema: dict, node: dict, path: str, sections: list) -> list[str]:
    node = _resolve(schema, node)
    rows = []
    for key, child in node.get("properties", {}).items():
        resolved = _resolve(schema, child)
        key_path = f"{path}.{key}" if path else key
        default = f"`{json.dumps(resolved['default'])}`" if "default" in resolved else ""
        rows.append(f"| `{key_path}` | {_kind(schema, child)} | {default} | {_cell(resolved.get('description', ''))} |")
        named = resolved.get("additionalProperties")
        if isinstance(named, dict) and not resolved.get("properties"):
            sections.append((f"{key_path}.NAME", named))
        elif resolved.get("properties"):
            sections.append((key_path, child))
    return rows


def page() -> str:
    schema = load_schema()
    lines = [INTRO]
    sections: list = []
    lines += ["## Top level", "", "| key | type | default | what it does |", "|---|---|---|---|"]
    lines += _rows(schema, schema, "", sections)
    done = set()
    while sections:
        path, node = sections.pop(0)
        if path in done:
            continue
        done.add(path)
        resolved = _resolve(schema, node)
        lines += ["", f"## `{path}`", ""]
        if resolved.get("description"):
            lines += [_cell(resolved["description"]), ""]
        lines += ["| key | type | default | what it does |", "|---|---|---|---|"]
        lines += _rows(schema, node, path, sections)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(page())
