"""The names GPU machines and the hub share are written once, in gpu_swarm_spawner/contract.py:
the worker code, setup.sh and `make status` take them from there instead of spelling them out."""

import ast
from pathlib import Path

import pytest

from gpu_swarm_spawner import contract

REPO = Path(__file__).resolve().parents[2]
#: What only contract.py may spell out.
SHARED = {
    "label prefix": contract.LABEL_PREFIX,
    "simulated GPU kind": contract.KIND_PREFIX + contract.SIMULATED_MARKER,
    "participant's service": contract.SERVICE_PREFIX + "-",
}
PYTHON = [
    *sorted((REPO / "worker_setup").glob("*.py")),
    *(REPO / "gpu_swarm_spawner" / name for name in ("spawner.py", "inventory.py")),
    *(REPO / "deploy" / name for name in ("status.py", "settings.py")),
    REPO / "jupyterhub_config.py",
]


def strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of the string constants in ``source``, docstrings and the ``help=`` of
    traits (documentation) left out."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    } | {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword) and node.arg == "help"
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings
    ]  # fmt: skip


@pytest.mark.parametrize("path", PYTHON, ids=lambda p: p.name)
def test_python_takes_the_shared_names_from_the_contract(path):
    spelt = [
        f"{path.name}:{line}: {what} {text!r}"
        for line, text in strings(path.read_text())
        for what, name in SHARED.items()
        if name in text
    ]
    assert not spelt, "use the names in gpu_swarm_spawner/contract.py"


def test_setup_sh_takes_the_shared_names_from_the_contract():
    lines = (REPO / "worker_setup" / "setup.sh").read_text().splitlines()
    spelt = [
        f"setup.sh:{number}: {what} {line.strip()!r}"
        for number, line in enumerate(lines, 1)
        if not line.lstrip().startswith("#")
        for what, name in SHARED.items()
        if name in line
    ]
    assert not spelt, "ask python: $(contract NAME) in setup.sh"
