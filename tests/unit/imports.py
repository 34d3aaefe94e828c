"""The imports a Python source makes, read from its syntax tree (imports inside functions too)."""

from __future__ import annotations

import ast


def imports(source: str, package: str = "") -> list[tuple[int, str]]:
    """(line, module) of each import in ``source``; ``from a import b`` gives a.b. A relative
    import is resolved against ``package`` (the dotted name of the source's package); without
    one, relative imports are left out."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module
            elif package:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + [node.module or ""])
                base = base.strip(".")
            else:
                continue
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found
