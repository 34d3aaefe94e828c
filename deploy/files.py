"""The files the settings name: relative paths resolved, and secrets that others may read
refused (the client secret, the TLS key). Part of the settings' reader (deploy/settings.py).
Standard library only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .envfile import _BOM, _UTF16_BOMS, Settings

# ---- files named by the settings ------------------------------------------------------------

#: Settings naming a file on this machine, which the deploy reads.
FILE_KEYS = (
    "GPUHUB_ROSTER",
    "GPUHUB_GITHUB_CLIENT_SECRET_FILE",
    "GPUHUB_TLS_CERT",
    "GPUHUB_TLS_KEY",
)


def resolve_paths(
    settings: Settings, config_path: str, cwd: str
) -> tuple[Settings, dict[str, str]]:
    """FILE_KEYS as absolute paths: a relative one set in the config file is taken from the
    config file's folder (where the organizer keeps the files it names), one from the
    environment from ``cwd``. Returns the settings and, for each key made absolute, a note
    saying what it was relative to (for the messages about it)."""
    values, notes = dict(settings.values), {}
    folder = str(Path(config_path).resolve().parent) if config_path else ""
    for key in FILE_KEYS:
        value = values.get(key, "")
        if not value or os.path.isabs(value):
            continue
        from_file = settings.origin.get(key, "").startswith(f"{config_path} line")
        base = folder if from_file and folder else cwd
        values[key] = os.path.normpath(os.path.join(base, value))
        notes[key] = (
            f"{value!r} is relative to "
            + ("the config file's folder " if from_file and folder else "the current folder ")
            + base
        )
    return Settings(values, settings.origin), notes


def read_secret_file(path: str) -> str:
    """The secret held by a file (GPUHUB_GITHUB_CLIENT_SECRET_FILE), as the deploy gives it to
    the hub: without a UTF-8 byte order mark and blanks or line ends around it. ValueError
    saying what to do for a file that holds no single secret; OSError if it cannot be read."""
    data = Path(path).read_bytes()
    if data.startswith(_UTF16_BOMS) or b"\0" in data:
        raise ValueError(
            "is saved as UTF-16 (PowerShell's >, Notepad's Unicode); write it again as plain "
            "text: Set-Content -Encoding ascii, or Notepad's Save as with Encoding UTF-8"
        )
    try:
        text = data.removeprefix(_BOM).decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text; write the secret into it as plain text") from None
    if not text:
        raise ValueError("is empty; write the OAuth app's client secret into it")
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise ValueError(
            "holds blanks, more than one line or invisible characters; keep only the client "
            "secret in it"
        )
    return text


def secret_file_problems(settings: dict[str, str]) -> list[str]:
    """A line for each secret file that its group or others may read: a GPUHUB_*SECRET*_FILE,
    which must also hold no more than the secret, and the TLS private key (GPUHUB_TLS_KEY with
    GPUHUB_TLS=files; its certificate is public)."""
    out = []
    for key, path in settings.items():
        secret = key.endswith("_FILE") and "SECRET" in key
        tls_key = key == "GPUHUB_TLS_KEY" and settings.get("GPUHUB_TLS") == "files"
        if not (path and (secret or tls_key)):
            continue
        try:
            found = os.stat(path)
            mode = found.st_mode
            if not stat.S_ISREG(mode):
                held = "the secret" if secret else "the private key"
                out.append(f"{key}: {path} is not a file; name the file holding {held}")
                continue
            if secret:
                read_secret_file(path)
        except OSError:
            continue  # "does not exist" is said by problems()
        except ValueError as e:
            out.append(f"{key}: {path} {e}")
            continue
        bits = open_to_others(path, mode)
        group = _group_name(found.st_gid)
        if tls_key and group in KEY_GROUPS:
            bits &= ~stat.S_IRWXG  # a group made for reading private keys
        if bits:
            who = "others" if bits & stat.S_IRWXO else f"its group {group}"
            out.append(
                f"{key}: {path} may be read by {who} (mode {stat.S_IMODE(mode):04o}); "
                f"run: chmod 600 {path}"
            )
    return out


#: Groups made for reading private keys: Debian's and Ubuntu's ssl-cert (/etc/ssl/private is
#: 0710 root:ssl-cert, its keys 0640, as ssl-cert-snakeoil.key): a TLS key its members may read
#: is accepted (others still may not)
KEY_GROUPS = ("ssl-cert",)


def _group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _folder_mode(folder: Path) -> int | None:
    try:
        return folder.stat().st_mode
    except OSError:
        return None


def open_to_others(path: str, mode: int) -> int:
    """The group and others bits of a file of ``mode`` at ``path`` that its folders let
    through: a group's bits count only where every folder above the file (links followed) lets
    the group in, others' likewise. 0: only its owner can reach it; so is a key of mode 0644
    in a folder of mode 0700 (an older certbot's ``/etc/letsencrypt/archive/``)."""
    bits = mode & (stat.S_IRWXG | stat.S_IRWXO)
    folder = Path(os.path.realpath(path)).parent
    for above in (folder, *folder.parents):
        folder_mode = _folder_mode(above)
        if folder_mode is None:
            continue
        if not folder_mode & stat.S_IXGRP:
            bits &= ~stat.S_IRWXG
        if not folder_mode & stat.S_IXOTH:
            bits &= ~stat.S_IRWXO
    return bits


def _noted(errors: list[str], settings: Settings, notes: dict[str, str]) -> list[str]:
    """Each line about a file named by a relative path says what the path is relative to."""
    out = []
    for line in errors:
        for key, note in notes.items():
            if key in line and settings.values[key] in line:
                line = f"{line} ({note})"
        out.append(line)
    return out
