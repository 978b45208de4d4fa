"""docs/ARCHITECTURE.md is the map a newcomer reads first: its numbers and file names must
be the tree's. It states the package's size and the core path's size in words a test can read."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def _lines(paths: list[Path]) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_stated_size_of_the_package_is_the_trees():
    files, lines = re.search(r"\*\*(\d+) Python files and about ([\d,]+) lines\*\*", DOC).groups()
    sources = sorted((ROOT / "minivllm").rglob("*.py"))
    assert abs(len(sources) - int(files)) <= 0.1 * len(sources), (len(sources), files)
    assert abs(_lines(sources) - _number(lines)) <= 0.1 * _lines(sources), (_lines(sources), lines)


def test_the_core_path_reading_list_names_real_files_and_their_size():
    section = DOC.split("## The core path in an afternoon", 1)[1].split("Everything else", 1)[0]
    files, lines = re.search(r"\*\*(\d+) files, about ([\d,]+) lines\*\*", section).groups()
    named = [ROOT / p for p in re.findall(r"`(minivllm/[\w/]+\.py)`", section)]
    assert all(p.is_file() for p in named), [str(p) for p in named if not p.is_file()]
    assert len(named) == int(files)
    assert abs(_lines(named) - _number(lines)) <= 0.1 * _lines(named), (_lines(named), lines)


def test_every_file_the_map_names_exists():
    named = set(re.findall(r"\b((?:minivllm|tests|tools|benchmarks)/[\w/]+\.py)\b", DOC))
    bare = set(re.findall(r"`((?:[a-z_]+/)+[a-z_0-9]+\.py)`", DOC)) - {n for n in named}
    missing = [p for p in named if not (ROOT / p).is_file()]
    missing += [p for p in bare if not (ROOT / p).is_file() and not (ROOT / "minivllm" / p).is_file()]
    assert missing == []
