"""Odd config-file lines that organizers really write, and what each must mean.

Each entry: (id, line, value) where value is what GPUHUB_X must be after reading the line, or
Refused(text): the line is refused with its line number and a message holding that text.
tests/unit/test_settings.py reads them with the parser; tests/unit/test_deploy.py checks that
each reaches the stack's environment as meant, or stops the deploy before it.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Refused:
    says: str


SECRET = "Zq9secret"  # never in an error message

CORPUS = [
    # blanks around the line, the name and the value do not count
    ("leading-space", " GPUHUB_AUTH=github", "github"),
    ("leading-tab", "\tGPUHUB_TLS=self-signed", "self-signed"),
    ("trailing-blanks", "GPUHUB_AUTH=github \t ", "github"),
    ("crlf", "GPUHUB_AUTH=github\r", "github"),
    ("spaces-around-equals", "GPUHUB_AUTH = github", "github"),
    ("export", "export GPUHUB_AUTH=github", "github"),
    ("indented-export-tab", "  export\tGPUHUB_TLS=self-signed", "self-signed"),
    # quotes around all of the value are removed; inside them everything is kept as written
    ("single-quotes", "GPUHUB_AUTH='github'", "github"),
    ("double-quotes", 'GPUHUB_AUTH="github"', "github"),
    ("quoted-blanks-kept", "GPUHUB_ALLOWED_ORGS=' org-a  org-b '", " org-a  org-b "),
    ("single-quoted-shell-chars", f"GPUHUB_GITHUB_CLIENT_SECRET='$a`b\\c #d ~e{SECRET}'", None),
    (
        "apostrophe-in-double-quotes",
        'GPUHUB_ACME_EMAIL="o\'brien@uni.example"',
        "o'brien@uni.example",
    ),
    ("inner-blanks-kept", "GPUHUB_ALLOWED_ORGS=org-a  org-b", "org-a  org-b"),
    ("empty", "GPUHUB_CPU_LIMIT=", ""),
    ("empty-quoted", "GPUHUB_CPU_LIMIT=''", ""),
    ("equals-in-value", "GPUHUB_ENVIRONMENTS=PyTorch=x/y:1", "PyTorch=x/y:1"),
    # a # inside a word belongs to the value
    ("hash-in-password", f"GPUHUB_GITHUB_CLIENT_SECRET=pa#{SECRET}", f"pa#{SECRET}"),
    ("hash-branch", "GPUHUB_TUTORIAL_REPOS=a=https://h/a.git#main", "a=https://h/a.git#main"),
    ("unicode-value", "GPUHUB_ACME_EMAIL=zoë@uni.example", "zoë@uni.example"),
    # ... and what cannot be taken for certain is refused
    ("comment-after-value", "GPUHUB_TLS=acme # automatic", Refused("on a line of its own")),
    ("comment-after-tab", "GPUHUB_TLS=acme\t#x", Refused("on a line of its own")),
    ("hash-first", f"GPUHUB_GITHUB_CLIENT_SECRET=#{SECRET}", Refused("quote it")),
    ("hash-after-blank", f"GPUHUB_GITHUB_CLIENT_SECRET=ab #{SECRET}", Refused("quote it")),
    ("unclosed-double", f'GPUHUB_GITHUB_CLIENT_SECRET="{SECRET}', Refused("does not close")),
    ("mismatched", "GPUHUB_AUTH='github\"", Refused("does not close")),
    ("stray-quote", "GPUHUB_AUTH=github'", Refused("the whole value in quotes")),
    ("inner-quote", f'GPUHUB_GITHUB_CLIENT_SECRET=a"{SECRET}', Refused("stray quote")),
    ("after-closing", 'GPUHUB_AUTH="github" # x', Refused("text after the closing")),
    ("dollar", "GPUHUB_STATE_DIR=$HOME/hub", Refused("taken literally")),
    ("dollar-in-double", 'GPUHUB_STATE_DIR="${HOME}/hub"', Refused("use single quotes")),
    ("backquote", "GPUHUB_HOSTNAME=`hostname -f`", Refused("taken literally")),
    ("continuation", "GPUHUB_ALLOWED_ORGS=org-a \\", Refused("taken literally")),
    ("tilde", "GPUHUB_ROSTER=~/roster.txt", Refused("write the full path")),
    ("two-settings", "GPUHUB_AUTH=github GPUHUB_TLS=acme", Refused("two settings on one line")),
    ("lower-case-name", "gpuhub_auth=github", Refused("upper case; write GPUHUB_AUTH=")),
    ("other-name", "AUTH=github", Refused("not a setting name")),
    ("space-in-name", "GPUHUB AUTH=github", Refused("not a setting name")),
    ("no-equals", f"{SECRET}", Refused("no '=' in it")),
    ("export-alone", "export GPUHUB_AUTH", Refused("no '=' in it")),
    ("no-break-space", "GPUHUB_AUTH=\u00a0github", Refused("U+00A0 (no-break space)")),
    ("zero-width", "GPUHUB_AUTH=git\u200bhub", Refused("U+200B")),
    ("lone-cr", "GPUHUB_AUTH=github\rGPUHUB_TLS=off", Refused("U+000D")),
]


def expected(line: str, value):
    """The value a corpus entry means (None: the text between the single quotes)."""
    if value is None:
        return line.split("'", 1)[1].rsplit("'", 1)[0]
    return value


def key_of(line: str) -> str:
    """The setting a corpus line means to set."""
    text = line.strip(" \t\r").removeprefix("export").strip(" \t")
    return text.split("=", 1)[0].strip(" \t").upper().replace(" ", "_")
