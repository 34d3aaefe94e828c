"""Which way the imports go (docs/architecture.md, "What each machine runs"): the GPU machines'
code (worker_setup) imports nothing of the organizer's deploy tool; the hub's code (the spawner,
the tutorial sync, jupyterhub_config.py and the settings' reader it calls) nothing of the GPU
machines'; the contract both import, the standard library only; and the hub's image
(images/hub/Dockerfile) copies in all the hub imports and no worker code. Read from the
sources, imports inside functions included (tests/integration/test_stack.py tries the built
image)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from .imports import imports

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "images" / "hub" / "Dockerfile"
CONTRACT = REPO / "gpu_swarm_spawner" / "contract.py"
#: The project's packages: an import of anything else is of the standard library or a
#: dependency.
PACKAGES = ("gpu_swarm_spawner", "worker_setup", "tutorial_sync", "deploy")
#: What the hub's image runs: the hub (its config, the spawner, the dashboard service) and the
#: tutorial-sync service (deploy/stack.yml); with everything of the project they import.
HUB_ENTRIES = ("jupyterhub_config.py", "gpu_swarm_spawner", "tutorial_sync")


def sources(*names: str) -> list[Path]:
    """The Python files of these packages (folders) and files under the repository."""
    found = []
    for name in names:
        path = REPO / name
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


def module_of(path: Path) -> str:
    """``deploy/settings.py`` -> deploy.settings; a package's __init__.py -> the package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of each import in ``path``, relative ones made absolute."""
    module = module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports(path.read_text(), package)


def top(module: str) -> str:
    return module.split(".")[0]


def wrong_imports(paths: list[Path], refused) -> list[str]:
    """``path:line: module`` for each import in ``paths`` that ``refused(module)`` is true of."""
    return [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in paths
        for line, module in imported(path)
        if refused(module)
    ]


def test_the_gpu_machines_code_imports_nothing_of_the_deploy_tool():
    wrong = wrong_imports(sources("worker_setup"), lambda m: top(m) == "deploy")
    assert not wrong, "worker_setup runs on GPU machines without the deploy tool; use the contract"


def test_the_hubs_code_imports_nothing_of_the_gpu_machines_code():
    wrong = wrong_imports(sorted(project_files(HUB_ENTRIES)), lambda m: top(m) == "worker_setup")
    assert not wrong, (
        "the hub's image has no worker_setup: what both sides need belongs in "
        "gpu_swarm_spawner/contract.py (standard library only)"
    )


def test_the_contract_imports_the_standard_library_only():
    wrong = wrong_imports(
        [CONTRACT], lambda m: top(m) not in sys.stdlib_module_names and top(m) != "__future__"
    )
    assert not wrong, "the contract runs on bare GPU machines and in the hub's image"


def project_file(module: str) -> Path | None:
    """The project's file of ``module`` (a.b.c: a/b/c.py or a/b/c/__init__.py), or of the module
    it names an attribute of (``from a.b import c`` gives a.b.c); None when it is not the
    project's."""
    while module and top(module) in PACKAGES:
        path = REPO.joinpath(*module.split("."))
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
        module = module.rpartition(".")[0]
    return None


def project_files(entries: tuple[str, ...]) -> set[Path]:
    """The project's files that ``entries`` (files and packages) are, import, and import in
    turn; with each package's __init__.py on the way."""
    seen: set[Path] = set()
    todo = sources(*entries)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        found = [project_file(m) for _, m in imported(path)]
        parents = path.relative_to(REPO).parents
        found += [REPO / p / "__init__.py" for p in parents if p.parts]
        todo += [p for p in found if p is not None and p not in seen]
    return seen


def copied_into_the_hub_image(dockerfile: str) -> set[Path]:
    """The repository's files the Dockerfile's COPY lines take (folders: every file in them)."""
    files: set[Path] = set()
    for line in dockerfile.replace("\\\n", " ").splitlines():  # continued lines joined
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--") for w in words):
            continue
        for source in words[1:-1]:
            path = REPO / source
            files |= {p for p in path.rglob("*") if p.is_file()} if path.is_dir() else {path}
    return {p for p in files if "__pycache__" not in p.parts}


def test_the_hub_image_copies_what_the_hub_imports_and_no_worker_code():
    copied = copied_into_the_hub_image(DOCKERFILE.read_text())
    needed = project_files(HUB_ENTRIES)
    missing = sorted(str(p.relative_to(REPO)) for p in needed - copied)
    assert not missing, f"the hub imports these, which images/hub/Dockerfile leaves out: {missing}"
    worker = sorted(
        str(p.relative_to(REPO)) for p in copied if p.is_relative_to(REPO / "worker_setup")
    )
    assert not worker, f"images/hub/Dockerfile copies worker code into the hub's image: {worker}"
    # of deploy, the settings' reader and what it imports: the organizer's CLI stays out
    deploy = REPO / "deploy"
    shipped = {p.name for p in copied if p.parent == deploy and p.suffix == ".py"}
    assert shipped == {p.name for p in needed if p.parent == deploy}
    reader = {"__init__.py", "settings.py", "envfile.py", "limits.py", "files.py", "values.py"}
    assert shipped == reader
    # what the settings' reader reads beside itself (from_environment's defaults)
    assert deploy / "settings.env" in copied
    # pyproject.toml's package discovery installs what was copied (settings.env as deploy's
    # package data: test_settings.py)
    assert "[tool.setuptools.packages.find]" in (REPO / "pyproject.toml").read_text()


def test_the_copies_read_here_are_the_dockerfiles():
    """Else the test above could pass on a Dockerfile it misread."""
    copied = copied_into_the_hub_image("COPY deploy/settings.py worker_setup /src/\nRUN x")
    assert REPO / "deploy" / "settings.py" in copied
    assert REPO / "worker_setup" / "guard_policy.py" in copied
    assert copied_into_the_hub_image("COPY --from=build /a /b\n") == set()
    continued = copied_into_the_hub_image(
        "COPY deploy/settings.py \\\n     deploy/values.py /src/\n"
    )
    assert continued == {REPO / "deploy" / "settings.py", REPO / "deploy" / "values.py"}
    needed = project_files(("deploy/settings.py",))
    assert REPO / "gpu_swarm_spawner" / "contract.py" in needed
    assert REPO / "gpu_swarm_spawner" / "__init__.py" in needed
    assert REPO / "tutorial_sync" / "repos.py" in needed
    assert not [p for p in needed if p.is_relative_to(REPO / "worker_setup")]


#: Within the GPU machine's side: the project's modules each of these may import (everything of
#: the project it imports, the imports of its imports aside). The GPU guard's modules import one
#: way, attribution <- notices <- the loop <- metrics <- the command (docs/architecture.md).
WORKER_ARROWS = {
    "worker_setup.gpus": {"gpu_swarm_spawner.contract"},
    "worker_setup.telemetry": {"worker_setup.gpus"},
    "worker_setup.guard_policy": {"gpu_swarm_spawner.contract"},
    "worker_setup.guard_attribution": {
        "gpu_swarm_spawner.contract",
        "worker_setup.guard_policy",
        "worker_setup.telemetry",
    },
    "worker_setup.guard_notices": {
        "worker_setup.guard_attribution",
        "worker_setup.guard_policy",
        "worker_setup.telemetry",
    },
    "worker_setup.guard": {
        "gpu_swarm_spawner.contract",
        "worker_setup.engine_api",
        "worker_setup.guard_attribution",
        "worker_setup.guard_notices",
        "worker_setup.guard_policy",
        "worker_setup.telemetry",
        "worker_setup.guard_command",  # its __main__ only: python -m worker_setup.guard
    },
    "worker_setup.guard_metrics": {"worker_setup.guard"},
    "worker_setup.guard_command": {
        "worker_setup.engine_api",
        "worker_setup.gpus",
        "worker_setup.guard",
        "worker_setup.guard_metrics",
        "worker_setup.guard_notices",
        "worker_setup.guard_policy",
        "worker_setup.guard_service",
    },
}


def project_imports(module: str) -> set[str]:
    """The project's modules that ``module``'s file imports, by their dotted names."""
    path = project_file(module)
    found = {project_file(m) for _, m in imported(path)} - {None}
    return {module_of(p) for p in found}


@pytest.mark.parametrize("module", sorted(WORKER_ARROWS))
def test_the_gpu_machines_modules_import_only_what_their_arrows_allow(module):
    wrong = sorted(project_imports(module) - WORKER_ARROWS[module])
    assert not wrong, f"{module} imports {wrong}: against the arrows; move the code instead"


def test_the_guards_modules_are_all_in_the_table_of_arrows():
    """A new guard_*.py module gets its arrows written down, so the table cannot go stale."""
    guard_modules = {module_of(p) for p in (REPO / "worker_setup").glob("guard*.py")}
    assert guard_modules - {"worker_setup.guard_service"} <= set(WORKER_ARROWS)


def test_the_arrows_are_read_as_the_sources_say():
    """Else the tests above could pass on imports they misread."""
    assert project_imports("worker_setup.guard_metrics") == {"worker_setup.guard"}
    assert "worker_setup.guard_attribution" in project_imports("worker_setup.guard_notices")
    assert "worker_setup.gpus" in project_imports("worker_setup.guard_command")  # inside main


def private_names_taken(source: str, module: str) -> list[str]:
    """``line: module.name`` for each name with a leading underscore that ``source`` (the file of
    ``module``) takes from another of the project's modules: ``from .gpus import _x``, or
    ``gpus._x`` where ``gpus`` (or its alias) is a module of the project imported there."""
    tree = ast.parse(source)
    aliases = {
        (node.lineno, alias.name): alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname
    }
    modules: dict[str, str] = {}  # a name bound to one of the project's modules -> the module
    found = []
    for line, name in imports(source, module.rpartition(".")[0]):
        base, _, last = name.rpartition(".")
        target = project_file(name)
        if target is not None and module_of(target) == name:
            modules[aliases.get((line, last), last)] = name
        elif private(last) and project_file(base) is not None:
            found.append(f"{line}: {name}")
    return found + [
        f"{node.lineno}: {modules[node.value.id]}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and private(node.attr)
    ]


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_of_the_gpu_machines_takes_another_modules_private_name():
    wrong = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sources("worker_setup")
        for line in private_names_taken(path.read_text(), module_of(path))
    ]
    assert not wrong, f"give these a public name in their module, or move them: {wrong}"


def test_private_names_taken_are_found():
    """Else the test above could pass on a name it missed."""
    source = (
        "from . import gpus\nfrom . import guard_policy as policy\nfrom .gpus import _ADVICE\n"
        "print(gpus._RESET, policy._x, gpus.GPU_FIX, gpus.__name__)\n"
    )
    assert private_names_taken(source, "worker_setup.probe") == [
        "3: worker_setup.gpus._ADVICE",
        "4: worker_setup.gpus._RESET",
        "4: worker_setup.guard_policy._x",
    ]
