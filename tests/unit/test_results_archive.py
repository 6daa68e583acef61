"""The archived raw results (bench/results/README.md, "Archived raw files"): every member of
the archive is a results file that git ignores once restored and no longer tracks, so a
restore never brings them back into commits or onto the GPU machine, and nothing the tests
or the shipped databases read was packed away."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
ARCHIVE = RESULTS / "archive" / "2026-12-02--05-json.tar.xz"


def _members() -> list[str]:
    with tarfile.open(ARCHIVE) as tar:
        return [m.name for m in tar.getmembers() if m.isfile()]


def test_the_archive_holds_results_files_that_git_ignores_and_no_longer_tracks():
    members = _members()
    assert members and all(m.startswith("bench/results/2026-12-0") and m.endswith(".json") for m in members)
    ignored = {line.strip().lstrip("/") for line in (RESULTS / ".gitignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {Path(m).name for m in members} == ignored
    try:
        tracked = subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    assert not set(members) & set(tracked)


def test_nothing_the_shipped_databases_read_was_archived():
    sources = json.loads((ROOT / "bench" / "shipped_sources.json").read_text())
    files = {e["file"] for gpu, entries in sources.items() if isinstance(entries, list) for e in entries}
    assert files and not files & set(_members())
    assert all((ROOT / f).exists() for f in files)
