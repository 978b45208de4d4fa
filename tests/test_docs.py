"""The committed config reference matches the schema it documents."""

from pathlib import Path

from tools.gen_config_docs import render

ROOT = Path(__file__).resolve().parents[1]


def test_config_reference_is_up_to_date():
    committed = (ROOT / "docs" / "CONFIG.md").read_text()
    assert committed == render(), "docs/CONFIG.md is stale: run `make docs`"


def test_every_schema_field_is_documented():
    text = render()
    assert "| `cache.block_size` |" in text
    undocumented = [line for line in text.splitlines() if line.startswith("| `") and line.rstrip().endswith("|  |")]
    assert not undocumented, undocumented
