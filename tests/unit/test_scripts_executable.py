"""Every script the README or a page of docs/ (or a line the scripts print, such as
`make join-command`'s) tells people to run as ``./path`` is executable in git, so a fresh clone
runs it as written."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Where people read the commands they run.
DOCS = [
    "README.md",
    *sorted(str(page.relative_to(REPO)) for page in (REPO / "docs").glob("*.md")),
    "deploy/steps.py",
    "worker_setup/setup.sh",
]


def git_modes() -> dict[str, str]:
    """{path: mode} of the files in git's index (what a commit, and so a clone, gets)."""
    result = subprocess.run(
        ["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.skip(f"not a git checkout: {result.stderr.strip()}")
    modes = {}
    for line in result.stdout.splitlines():
        meta, path = line.split("\t", 1)
        modes[path] = meta.split()[0]
    return modes


def run_directly() -> set[str]:
    """The tracked files the docs run as ``./path`` (``sudo ./worker_setup/setup.sh ...``)."""
    found = set()
    for doc in DOCS:
        found |= set(re.findall(r"(?:^|[\s`(])\./([\w./-]+\w)", (REPO / doc).read_text(), re.M))
    return found


def test_scripts_people_run_directly_are_executable_in_git():
    modes = git_modes()
    scripts = sorted(path for path in run_directly() if path in modes)
    assert "worker_setup/setup.sh" in scripts
    not_executable = [path for path in scripts if modes[path] != "100755"]
    assert not not_executable, (
        f"{not_executable} are run as ./PATH but not executable in git; "
        "run: git update-index --chmod=+x " + " ".join(not_executable)
    )
    for path in scripts:
        assert (REPO / path).read_text().startswith("#!"), f"{path} has no #! line"
