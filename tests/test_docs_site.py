"""The documentation site builds (``mkdocs build --strict``) and its API reference renders as Markdown.

A strict build passes with docstrings mkdocstrings cannot read (RST roles, numpydoc parameters whose
description sits on the ``name : type`` line): they render as literal ``:class:`` text and as prose in the
Type column. So the rendered HTML itself is read: no RST role or double backtick left, no doctest flags,
and ``pp.quantize``'s parameters as a table of names with descriptions.
"""

import html
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("mkdocstrings_handlers.python")

ROOT = Path(__file__).resolve().parents[1]
ROLES = (":mod:", ":func:", ":class:", ":meth:", ":attr:", ":data:", ":obj:", ":exc:")


@pytest.fixture(scope="module")
def api_html(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return (site / "api" / "index.html").read_text(encoding="utf-8")


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_api_reference_has_no_rst_left(api_html):
    text = _text(api_html)
    assert not [role for role in ROLES if role in text]
    assert "``" not in text
    assert "doctest:" not in text


class _Tables(HTMLParser):
    """The rows (cells' text) of each table in a fragment."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _section(page: str, object_id: str) -> str:
    start = page.index(f'id="{object_id}"')
    end = page.find('<div class="doc doc-object', start)
    return page[start:end if end > 0 else None]


def test_pp_quantize_parameters_are_a_table_of_names_and_descriptions(api_html):
    parser = _Tables()
    parser.feed(_section(api_html, "ptq_protein.quantize"))
    header, *rows = parser.tables[0]
    assert header[:3] == ["Name", "Type", "Description"]
    table = {row[0]: row for row in rows}
    for name in ("model", "config", "calibration", "budget", "max_bits_avg"):
        assert name in table, sorted(table)
        _, kind, description = table[name][:3]
        assert len(description.split()) >= 3, (name, description)
        assert len(kind.split()) <= 8 and "." not in kind.rstrip("."), (name, kind)  # a type, not prose


def test_every_preset_is_in_the_methods_page():
    """docs/methods.md's table names every preset (the study's own rows as `study-*`)."""
    from ptq_protein.recipes.presets import PRESETS

    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    assert [name for name in PRESETS if f"`{name}`" not in text and not name.startswith("study-")] == []
