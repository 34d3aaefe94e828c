"""The spawner's parts are collaborators, not slices of one class (docs/architecture.md, "The
spawner's parts"): ``GPUSwarmSpawner`` (spawner.py) is the one class JupyterHub sees, and each
``spawner_*.py`` beside it holds pure functions and small objects given their inputs. A part
written as a mixin reads the spawner through ``self`` (``self.broker`` defined in spawner.py,
``self._report`` in another part), which a reader and every static tool lose track of at the
first call. Read from the sources: a class of a part built on a class of elsewhere, a ``self.``
read of a name its class does not define, and a function handed the spawner whole."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARTS = sorted((REPO / "gpu_swarm_spawner").glob("spawner_*.py"))
#: Parameter names that hand a function the spawner whole: a mixin by another name.
SPAWNER_NAMES = ("spawner", "self")


def defined(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> set[str]:
    """The names ``cls`` defines: its methods and class attributes (a dataclass's fields), what
    its methods assign to ``self``, and the same of its bases in the same module."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and getattr(node.value, "id", None) == "self"
        ):
            names.add(node.attr)
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id != cls.name:
            names |= defined(classes[base.id], classes)
    return names


def methods(tree: ast.Module) -> set[ast.AST]:
    """The functions defined directly in a class body (where ``self`` is the class's own)."""
    return {
        item
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def mixin_reads(source: str) -> list[str]:
    """``line: what`` for each way ``source`` (a part's module) reads the spawner: a class built
    on a class of elsewhere (HasTraits, the spawner's traits, another part), a ``self.`` read
    of a name its class does not define, and a function given the spawner whole."""
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    found = []
    for cls in classes.values():
        for base in cls.bases:
            if not (isinstance(base, ast.Name) and base.id in classes):
                found.append(f"{cls.lineno}: class {cls.name} built on {ast.unparse(base)}")
        own = defined(cls, classes)
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Load)
                and getattr(node.value, "id", None) == "self"
                and node.attr not in own
                and not node.attr.startswith("__")
            ):
                found.append(f"{node.lineno}: self.{node.attr}, which {cls.name} does not define")
    in_classes = methods(tree)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        for arg in arguments:
            method_self = node in in_classes and arg is arguments[0] and arg.arg == "self"
            if arg.arg in SPAWNER_NAMES and not method_self:
                found.append(f"{node.lineno}: {node.name}({arg.arg}) is handed the spawner whole")
    return found


@pytest.mark.parametrize("part", [p.name for p in PARTS])
def test_no_part_of_the_spawner_reads_it_through_self(part):
    found = mixin_reads((REPO / "gpu_swarm_spawner" / part).read_text())
    assert not found, (
        f"{part} reads the spawner: {found}. Take what is needed as arguments (a pure function, "
        "or a small object made with it) and call it from GPUSwarmSpawner's hook in spawner.py"
    )


def test_the_parts_are_found():
    names = {p.name for p in PARTS}
    assert {"spawner_gpu.py", "spawner_page.py", "spawner_health.py", "spawner_server.py"} <= names
    assert "spawner.py" not in names  # the class JupyterHub sees is not a part


MIXIN = """
class ServerHealth(HasTraits):
    def _judge(self, seen):
        self._away_since = 1
        self._healed("back", self.log_name)
        return self._away_since
"""

COLLABORATOR = """
@dataclass(frozen=True)
class Reporter:
    log: object
    stages: list

    def report(self, percent, message):
        self.stages.append((percent, message))
        self.log.debug("%s", message)
        self.seen = True
        return self.seen, self.__class__

class Quiet(Reporter):
    def report(self, percent, message):
        return self.stages

def judge(seen, now, away_since):
    return seen
"""


def test_the_reading_finds_a_mixin_and_passes_a_collaborator():
    """Else the test above could pass on a mixin it missed."""
    assert mixin_reads(MIXIN) == [
        "2: class ServerHealth built on HasTraits",
        "5: self._healed, which ServerHealth does not define",
        "5: self.log_name, which ServerHealth does not define",
    ]
    assert mixin_reads(COLLABORATOR) == []
    handed = "def record(spawner, kind):\n    return spawner.broker\n"
    assert mixin_reads(handed) == ["1: record(spawner) is handed the spawner whole"]
    assert mixin_reads("def page(self):\n    return self.user\n") == [
        "1: page(self) is handed the spawner whole"
    ]
    nested = "class A:\n    def f(self):\n        def g(self):\n            pass\n"
    assert mixin_reads(nested) == ["3: g(self) is handed the spawner whole"]
