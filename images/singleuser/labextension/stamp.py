"""The stamp of the committed build of the lab extension gpuhub-notices: what it was built from.

``make labextension`` builds the extension (build.sh) into the folder that package.json's
``jupyterlab.outputDir`` names, then runs ``python3 stamp.py write``: build-stamp.json records
the JupyterLab pin of the image's requirements.txt (the build is made against that JupyterLab),
one SHA-256 of the sources (`SOURCES`, the ``src/`` and ``style/`` trees) and the SHA-256 of
every file it built. ``python3 stamp.py check`` (and tests/unit/test_notices.py) lists what
disagrees: the pin or a source changed since the build, a built file changed, missing or added
by hand. Standard library only: the check needs no Node.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAMP = "build-stamp.json"
#: the files of this package the build reads, beside the src/ and style/ trees
SOURCES = ("package.json", "package-lock.json", "tsconfig.json", "webpack.config.js", "build.sh")
TREES = ("src", "style")
#: the pin of the image's JupyterLab, whose core package.json the build is made against
REQUIREMENTS = "requirements.txt"
PIN = re.compile(r"^jupyterlab==(\S+)\s*$", re.M)
REBUILD = "run `make labextension` and commit what it changes (docs/development.md)"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def jupyterlab_pin(package: Path = HERE) -> str:
    """The version in ``jupyterlab==X`` of the image's requirements.txt, beside this folder."""
    text = (package.parent / REQUIREMENTS).read_text()
    found = PIN.search(text)
    if not found:
        raise ValueError(f"no `jupyterlab==VERSION` line in {package.parent / REQUIREMENTS}")
    return found.group(1)


def source_files(package: Path = HERE) -> list[str]:
    """The sources' paths under ``package``, sorted."""
    paths = [name for name in SOURCES if (package / name).is_file()]
    for tree in TREES:
        paths += [
            path.relative_to(package).as_posix()
            for path in (package / tree).rglob("*")
            if path.is_file()
        ]
    return sorted(paths)


def sources_digest(package: Path = HERE) -> str:
    """One SHA-256 over every source's path and content."""
    lines = [f"{path} {sha256((package / path).read_bytes())}" for path in source_files(package)]
    return sha256("\n".join(lines).encode())


def output_dir(package: Path = HERE) -> Path:
    """Where the build writes: package.json's ``jupyterlab.outputDir``."""
    data = json.loads((package / "package.json").read_text())
    return (package / data["jupyterlab"]["outputDir"]).resolve()


def output_files(package: Path = HERE) -> dict[str, str]:
    """``{path under the output folder: its SHA-256}`` of every built file."""
    out = output_dir(package)
    return {
        path.relative_to(out).as_posix(): sha256(path.read_bytes())
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


def stamp(package: Path = HERE) -> dict:
    return {
        "comment": "written by `make labextension` (stamp.py): what the committed build is of",
        "jupyterlab": jupyterlab_pin(package),
        "sources": sources_digest(package),
        "output": output_files(package),
    }


def write(package: Path = HERE) -> None:
    (package / STAMP).write_text(json.dumps(stamp(package), indent=2) + "\n")


def problems(package: Path = HERE) -> list[str]:
    """What disagrees between the sources, the stamp and the built files; [] when none."""
    try:
        recorded = json.loads((package / STAMP).read_text())
    except (OSError, ValueError) as error:
        return [f"{STAMP} cannot be read ({error}): {REBUILD}"]
    found = []
    if recorded.get("jupyterlab") != jupyterlab_pin(package):
        found.append(
            f"the build is for JupyterLab {recorded.get('jupyterlab')}, the image's "
            f"requirements.txt pins {jupyterlab_pin(package)}: update package.json's @jupyterlab "
            f"dependencies (npm install), then {REBUILD}"
        )
    elif recorded.get("sources") != sources_digest(package):
        found.append(f"the sources changed since the committed build: {REBUILD}")
    built, stamped = output_files(package), recorded.get("output") or {}
    for path in sorted(set(built) | set(stamped)):
        if path not in built:
            found.append(f"{path}, built then, is missing: {REBUILD}")
        elif path not in stamped:
            found.append(f"{path} was not built by `make labextension`: {REBUILD}")
        elif built[path] != stamped[path]:
            found.append(f"{path} differs from what `make labextension` built: {REBUILD}")
    return found


def main(argv: list[str]) -> int:
    if argv == ["pin"]:  # for build.sh
        print(jupyterlab_pin())
        return 0
    if argv == ["write"]:
        write()
        return 0
    if argv == ["check"]:
        found = problems()
        for problem in found:
            print(f"error: {problem}", file=sys.stderr)
        return 1 if found else 0
    print("usage: stamp.py write|check|pin", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
