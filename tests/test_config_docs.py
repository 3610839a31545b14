"""docs/configuration.md is generated from the config structs' descriptions and kept current.

Covers: daemon/config_docs.py, docs/configuration.md.
"""
from pathlib import Path

from daemon.config import field_docs
from daemon.config_docs import render_markdown

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DOC = ROOT / "docs" / "configuration.md"


def test_configuration_doc_is_current():
    assert CONFIG_DOC.read_text() == render_markdown(), (
        "docs/configuration.md is stale: regenerate it with "
        "`python -m daemon.config_docs > docs/configuration.md`")


def test_configuration_doc_lists_every_setting_with_its_flag():
    text = render_markdown()
    for field in field_docs():
        assert f"| `{field.name}` | `--{field.name.replace('_', '-')}`" in text, field.name
        assert f"## [{field.section}]" in text
