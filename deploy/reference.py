"""The files written from the settings table (gpu_swarm_spawner/settings_table.py):
deploy/settings.env
(every setting, its default and its comment), docs/configuration.md (rendered from that file's
text, grouped as it groups them) and the ``environment:`` of the services in deploy/stack*.yml
that the table sends settings to.

``render(text)`` is a pure function of settings.env's text, ``environment(text, service,
names)`` of a stack file's. ``python -m deploy.reference`` writes them (``make docs``);
``--check`` writes nothing and exits 1 naming each file that differs from what the table gives,
so a setting changed without regenerating fails the unit tests.

How settings.env is read for the page (the config file's line format, deploy/config.example.env):

- the comment lines at the top, up to the first blank line, introduce the page;
- a comment line of the form ``# ---- title ----`` starts a group of its own;
- the comment lines right above one or more ``GPUHUB_X=value`` lines document those settings
  together (an empty ``#`` line starts a new paragraph);
- a comment block followed by a blank line describes the group it stands in.

Standard library only, like the rest of ``deploy``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpu_swarm_spawner import settings_table
from gpu_swarm_spawner.settings_table import ENVIRONMENTS, Setting

REPO = Path(__file__).resolve().parents[1]
SETTINGS = Path("deploy/settings.env")
PAGE = Path("docs/configuration.md")
STALE = f"{PAGE} is stale: run make docs"
DEPLOY = Path("deploy")

#: The title of the settings above the file's first ``# ---- title ----`` line.
FIRST_GROUP = "Settings an organizer may set"

_SETTING = re.compile(r"^\s*(?:export[ \t]+)?(GPUHUB_[A-Z0-9_]+)[ \t]*=(.*)$")
_HEADING = re.compile(r"^#[ \t]*-{3,}[ \t]*(.+?)[ \t]*-{3,}[ \t]*$")


@dataclass
class Block:
    """Settings documented by one comment: [(key, default)] and the comment's paragraphs."""

    settings: list[tuple[str, str]] = field(default_factory=list)
    paragraphs: list[str] = field(default_factory=list)


@dataclass
class Group:
    title: str
    description: list[str] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)


def _value(raw: str) -> str:
    """The default as the settings reader takes it: blanks around it dropped, one pair of
    quotes around all of it removed, nothing expanded."""
    value = raw.strip(" \t")
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _paragraphs(comment: list[str]) -> list[str]:
    """Comment lines (without their ``#``) as paragraphs: wrapped lines joined, an empty line
    between paragraphs."""
    paragraphs, lines = [], []
    for line in [*comment, ""]:
        if line.strip():
            lines.append(line.strip())
        elif lines:
            paragraphs.append(" ".join(lines))
            lines = []
    return paragraphs


def parse(text: str) -> tuple[list[str], list[Group]]:
    """(the introduction's paragraphs, the groups) of deploy/settings.env's text."""
    intro: list[str] = []
    groups = [Group(FIRST_GROUP)]
    comment: list[str] = []
    block: Block | None = None  # the block whose settings are being read
    started = False  # past the introduction

    def describe() -> None:
        """A comment block that documents no setting: the introduction, or its group's."""
        if comment:
            (groups[-1].description if started else intro).extend(_paragraphs(comment))
        comment.clear()

    for raw in [*text.lstrip("\ufeff").splitlines(), ""]:
        line = raw.strip(" \t")
        heading = _HEADING.match(line)
        setting = _SETTING.match(line)
        if heading:
            describe()
            groups.append(Group(heading.group(1)))
            block, started = None, True
        elif line.startswith("#"):
            block = None
            after = line[1:]
            comment.append(after[1:] if after.startswith(" ") else after)
        elif setting:
            if block is None:
                block = Block(paragraphs=_paragraphs(comment))
                groups[-1].blocks.append(block)
                comment.clear()
            block.settings.append((setting.group(1), _value(setting.group(2))))
            started = True
        elif not line:
            describe()
            block, started = None, True
    return intro, [group for group in groups if group.blocks or group.description]


def _escaped(text: str) -> str:
    """Prose for Markdown: ``<`` outside code spans is written ``&lt;``, so that
    ``https://<hostname>/`` is not taken for an HTML tag and dropped."""
    parts = re.split(r"(`+[^`]*`+)", text)
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;") for part in parts)


def _code(value: str) -> str:
    """``value`` as a Markdown code span (in a table cell); an empty value says so."""
    if not value:
        return "empty"
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", value)), default=0) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{ticks}{pad}{value}{pad}{ticks}".replace("|", "\\|")


def _slug(title: str) -> str:
    """GitHub's anchor for a heading of plain text (lower case, blanks to hyphens, other
    punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _title(block: Block) -> str:
    return ", ".join(key for key, _ in block.settings)


def anchors(settings_env_text: str) -> dict[str, str]:
    """Each setting's anchor in docs/configuration.md: the heading of its block (settings
    documented together share one)."""
    _intro, groups = parse(settings_env_text)
    return {
        key: _slug(_title(block))
        for group in groups
        for block in group.blocks
        for key, _ in block.settings
    }


def render(settings_env_text: str) -> str:
    """docs/configuration.md for deploy/settings.env's text."""
    intro, groups = parse(settings_env_text)
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from gpu_swarm_spawner/settings_table.py by `make docs` (python -m "
        "deploy.reference): edit that table, then run make docs. -->",
        "",
        "Every setting of the hub, with its default and what it does, as `deploy/settings.env` "
        "declares it. How to write the values an organizer sets most (limits, admins, "
        "organizations, the hostname, files) is in [input-config.md](input-config.md); how the "
        "settings reach the hub and the spawner's own options are in "
        "[spawner-options.md](spawner-options.md).",
        "",
    ]
    if intro:
        out += ["`deploy/settings.env` begins:", ""]
        out += "\n>\n".join(f"> {_escaped(paragraph)}" for paragraph in intro).split("\n")
        out.append("")
    out += ["| setting | default |", "| --- | --- |"]
    anchor = anchors(settings_env_text)
    for group in groups:
        for block in group.blocks:
            for key, value in block.settings:
                out.append(f"| [`{key}`](#{anchor[key]}) | {_code(value)} |")
    out.append("")
    for group in groups:
        out += [f"## {group.title[:1].upper()}{group.title[1:]}", ""]
        for paragraph in group.description:
            out += [_escaped(paragraph), ""]
        for block in group.blocks:
            out += [f"### {_title(block)}", ""]
            if len(block.settings) == 1:
                out += [f"Default: {_code(block.settings[0][1])}", ""]
            else:
                out += ["| setting | default |", "| --- | --- |"]
                out += [f"| `{key}` | {_code(value)} |" for key, value in block.settings]
                out.append("")
            for paragraph in block.paragraphs:
                out += [_escaped(paragraph), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def environment(text: str, service: str, names: Iterable[str]) -> str:
    """A stack file's text with ``service``'s ``environment:`` passing ``names``, each as
    ``NAME: ${NAME}`` (what ``docker stack deploy`` interpolates from the settings)."""
    lines = text.split("\n")
    start = lines.index(f"  {service}:")
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"^ {0,2}[^ #]", lines[i])),
        len(lines),
    )
    at = lines.index("    environment:", start, end) + 1
    after = at
    while after < end and lines[after].startswith("      "):
        after += 1
    passed = [f"      {name}: ${{{name}}}" for name in names]
    return "\n".join(lines[:at] + passed + lines[after:])


def generated(root: Path, settings: Sequence[Setting] = settings_table.SETTINGS) -> dict[Path, str]:
    """{path under ``root``: its text} of every file the table writes."""
    env = settings_table.settings_env(settings)
    files = {SETTINGS: env, PAGE: render(env)}
    for to, (name, service) in ENVIRONMENTS.items():
        path = DEPLOY / name
        text = files.get(path) or (root / path).read_text(encoding="utf-8")
        files[path] = environment(text, service, [s.name for s in settings if to in s.to])
    return files


def main(
    argv: list[str] | None = None,
    root: Path = REPO,
    settings: Sequence[Setting] = settings_table.SETTINGS,
) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.reference",
        description=f"Write {SETTINGS}, {PAGE} and the stack files' environments from "
        "gpu_swarm_spawner/settings_table.py.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a file is stale"
    )
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated(root, settings).items():
        target = root / path
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if args.check:
        for path in stale:
            print(f"{path} is stale: run make docs", file=sys.stderr)
        return 1 if stale else 0
    if not stale:
        print("every generated file is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
