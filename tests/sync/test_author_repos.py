"""Tutorial repositories as authors make them, followed from the author's push through the
publisher (share and manifest) and the sync service's /status to the start hook and the home:
Windows line endings and .gitattributes, Git LFS pointers, submodules, executable scripts, a
file that becomes a folder and back, names near and over 255 bytes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from tornado.httpclient import AsyncHTTPClient

from tutorial_sync import MANIFEST, start_hook
from tutorial_sync.publish import Publisher, Repo
from tutorial_sync.service import SyncService, make_app

from .gitrepos import LFS_TRACK, Author, add_by_plumbing, add_submodule, blob_id, lfs_pointer


class Course:
    """An author's repository, published as ``gpu101``, and one participant's home."""

    def __init__(self, tmp: Path):
        self.author = Author(tmp)
        self.publisher = Publisher(tmp / "share", tmp / "cache")
        self.repo = Repo("gpu101", self.author.url)
        self.home = tmp / "home" / "tutorials"
        self.state = tmp / "home" / ".local" / "tutorials.json"

    def push(self, message: str, **kwargs) -> None:
        self.author.commit_and_push(message, **kwargs)
        self.publisher.sync(self.repo)

    @property
    def version(self) -> Path:
        return Path(os.path.realpath(self.publisher.root / "gpu101"))

    def manifest(self) -> dict:
        return json.loads((self.version / MANIFEST).read_text())

    def start(self, capsys) -> tuple[str, str]:
        """One server start: the hook's exit code must be 0; its stdout and stderr."""
        argv = ["--share", str(self.publisher.root), "--home", str(self.home)]
        assert start_hook.main([*argv, "--state", str(self.state)]) == 0
        return capsys.readouterr()

    def notice(self) -> str:
        path = self.home / start_hook.NOTICE
        return path.read_text() if path.exists() else ""

    def home_files(self) -> dict[str, bytes]:
        folder = self.home / "gpu101"
        return {
            str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
        }


@pytest.fixture
def course(tmp_path):
    return Course(tmp_path)


def share_files(version: Path) -> dict[str, str]:
    """{path: blob id} of what is really on the share."""
    return {
        str(p.relative_to(version)): blob_id(p.read_bytes())
        for p in version.rglob("*")
        if p.is_file() and p.name != MANIFEST
    }


# ---- .gitattributes -----------------------------------------------------------------------------

#: a Windows author's .gitattributes: Visual Studio's "normalise, but check out with CRLF" for
#: its own files, GitHub's advice for scripts, a version stamp, and what is kept out of archives
WINDOWS_ATTRIBUTES = """\
# Set default behavior to automatically normalize line endings.
* text=auto

# Files that must keep Windows line endings when checked out
*.ipynb text eol=crlf
*.bat   text eol=crlf
*.ps1   text working-tree-encoding=UTF-16LE-BOM eol=crlf
*.sh    text eol=lf

# Binary files
*.png binary

version.py export-subst
README.md  ident
.github/   export-ignore
solutions/** export-ignore
notes-for-teaching-assistants.md export-ignore
"""


def windows_repository(author: Author) -> None:
    author.git("config", "core.autocrlf", "true")  # Git for Windows' default
    author.write(".gitattributes", WINDOWS_ATTRIBUTES.replace("\n", "\r\n"))
    author.write("01-intro.ipynb", '{\r\n "cells": [],\r\n "nbformat": 4\r\n}\r\n')
    author.write("setup.bat", "@echo off\r\npip install -r requirements.txt\r\n")
    author.write("setup.ps1", "Write-Host 'ready'\r\n")
    author.write("run.sh", "#!/bin/sh\r\necho ready\r\n")
    author.write("requirements.txt", "numpy\r\ntorch\r\n")
    author.write("plot.png", b"\x89PNG\r\n\x1a\n\x00\x00\r\n")
    author.write("version.py", 'COMMIT = "$Format:%H$"\r\n')
    author.write("README.md", "# GPU 101\r\n\r\n$Id$\r\n")
    author.write(".github/workflows/ci.yml", "on: push\r\n")
    author.write("solutions/01-intro.ipynb", "{}\r\n")
    author.write("notes-for-teaching-assistants.md", "the answers\r\n")


def test_gitattributes_the_share_holds_what_the_manifest_records(course, capsys):
    windows_repository(course.author)
    course.push("first, from Windows")
    manifest = course.manifest()
    assert manifest["files"] == share_files(course.version), "the manifest hashes the share"
    share = course.version
    assert (share / "01-intro.ipynb").read_bytes().count(b"\r\n") == 4, "eol=crlf applied"
    assert (share / "setup.bat").read_bytes().endswith(b"install -r requirements.txt\r\n")
    assert (share / "setup.ps1").read_bytes().startswith(b"\xff\xfe"), "working-tree-encoding"
    assert (share / "run.sh").read_bytes() == b"#!/bin/sh\necho ready\n"
    assert (share / "requirements.txt").read_bytes() == b"numpy\ntorch\n", "text=auto: LF"
    assert (share / "plot.png").read_bytes() == b"\x89PNG\r\n\x1a\n\x00\x00\r\n", "binary intact"
    commit = course.author.git("rev-parse", "HEAD")
    assert f'COMMIT = "{commit}"'.encode() in (share / "version.py").read_bytes()
    assert b"$Id: " in (share / "README.md").read_bytes()
    for ignored in (".github/workflows/ci.yml", "solutions/01-intro.ipynb"):
        assert ignored not in manifest["files"] and not (share / ignored).exists()
    assert "notes-for-teaching-assistants.md" not in manifest["files"]
    assert not (share / ".github").exists() and not (share / "solutions").exists(), "no empty one"

    out, err = course.start(capsys)
    assert f"{len(manifest['files'])} copy" in out and "failed" not in out, err
    assert course.home_files() == {p: (share / p).read_bytes() for p in manifest["files"]}
    out, _ = course.start(capsys)
    assert f"{len(manifest['files'])} keep" in out, "untouched copies are recognised"

    course.author.write("01-intro.ipynb", '{\r\n "cells": ["new"],\r\n "nbformat": 4\r\n}\r\n')
    course.push("second")
    out, _ = course.start(capsys)
    assert "2 update" in out and "beside" not in out and "failed" not in out, "and version.py"
    new = course.author.git("rev-parse", "HEAD")
    assert f'COMMIT = "{new}"'.encode() in (course.home / "gpu101" / "version.py").read_bytes()
    assert not list(course.home.rglob("*.new-*")), "no false 'you changed it'"
    assert course.notice() == ""
    assert b'"new"' in (course.home / "gpu101" / "01-intro.ipynb").read_bytes()


def test_machine_git_configuration_does_not_change_what_is_published(course, tmp_path, monkeypatch):
    """A service machine whose global git config converts line endings or runs git-lfs's
    filter (``git lfs install``, no LFS server) publishes the same bytes as any other."""
    course.author.write(".gitattributes", "*.txt text\n*.bin " + LFS_TRACK.format(pattern=""))
    course.author.write("a.txt", "one\ntwo\n")
    course.author.write("model.bin", lfs_pointer(b"weights"))
    course.author.commit_and_push("first")
    config = tmp_path / "gitconfig"
    config.write_text(
        "[core]\n\tautocrlf = true\n\teol = crlf\n"
        '[filter "lfs"]\n\tsmudge = false\n\tprocess = false\n\trequired = true\n'
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    course.publisher.sync(course.repo)
    assert (course.version / "a.txt").read_bytes() == b"one\ntwo\n"
    assert "model.bin" in course.manifest()["skipped"]


# ---- Git LFS -------------------------------------------------------------------------------------


async def test_lfs_pointers_are_not_published_and_said_on_status_and_at_start(course, capsys):
    author = course.author
    author.write("models/small.pt", b"committed before git lfs track: real bytes")
    author.commit_and_push("a real file")
    author.write(
        ".gitattributes", LFS_TRACK.format(pattern="*.pt") + LFS_TRACK.format(pattern="*.h5")
    )
    author.write("models/resnet.pt", lfs_pointer(os.urandom(2000)))
    author.write("weights/big.h5", lfs_pointer(b"x" * 1_500_000))
    author.write(
        "notes/lfs.md", "version https://git-lfs.github.com/spec/v1 is the pointer's first line\n"
    )
    # a lesson's example: a pointer's first lines, without the oid and size git-lfs needs
    author.write("notes/pointer.txt", "version https://git-lfs.github.com/spec/v1\nsize 12\n")
    author.write("train.ipynb", "{}")
    author.commit_and_push("models through LFS")
    service = SyncService(course.publisher, [course.repo])
    await service.sync_all("start")

    skipped = service.status["gpu101"].skipped
    assert set(skipped) == {"models/resnet.pt", "weights/big.h5"}
    assert "Git LFS pointer" in skipped["weights/big.h5"] and "1.5 MB" in skipped["weights/big.h5"]
    assert "commit the file without LFS" in skipped["models/resnet.pt"]
    assert "datasets folder" in skipped["models/resnet.pt"]
    files = course.manifest()["files"]
    assert "models/small.pt" in files and "notes/lfs.md" in files and "train.ipynb" in files
    assert "notes/pointer.txt" in files
    assert not (course.version / "models" / "resnet.pt").exists()
    assert not (course.version / "weights").exists(), "no folder left empty"
    assert files == share_files(course.version)

    out, err = course.start(capsys)
    assert "2 file(s) not published by the sync service: gpu101/models/resnet.pt" in err
    notice = course.notice()
    assert "## Not published" in notice
    assert "`gpu101/weights/big.h5`: it is a Git LFS pointer" in notice
    assert not [p for p, data in course.home_files().items() if b"oid sha256:" in data]
    assert not (course.home / "gpu101" / "models" / "resnet.pt").exists()
    assert (course.home / "gpu101" / "models" / "small.pt").exists()


# ---- submodules ----------------------------------------------------------------------------------

TOKEN = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"


async def test_a_submodule_is_no_empty_folder_and_is_said_on_status_and_at_start(
    course, tmp_path, capsys
):
    author = course.author
    author.write("01-intro.ipynb", "{}")
    shown = f"https://x-access-token:{TOKEN}@github.com/gpu-school/helpers.git"
    commit = add_submodule(author, tmp_path, "vendor/helpers", shown)
    author.commit_and_push("helpers as a submodule")
    service = SyncService(course.publisher, [course.repo])
    await service.sync_all("start")

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = make_app(service).listen(port, address="127.0.0.1")
    try:
        answer = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}/status")
    finally:
        server.stop()
    assert TOKEN not in answer.body.decode()
    (status,) = json.loads(answer.body)["repos"]
    why = status["skipped"]["vendor/helpers"]
    assert why.startswith("is a git submodule (https://github.com/gpu-school/helpers.git at ")
    assert commit[:12] in why and "copy its files into this repository" in why
    assert not (course.version / "vendor").exists(), "no empty folder"
    assert not (course.version / ".gitmodules").exists()
    on_share = [p.read_bytes() for p in course.version.rglob("*") if p.is_file()]
    assert not [data for data in on_share if TOKEN.encode() in data], "no credentials on the share"
    assert course.manifest()["files"] == share_files(course.version)

    out, err = course.start(capsys)
    assert "1 copy" in out and "failed" not in out
    assert "gpu101/vendor/helpers" in err
    assert "`gpu101/vendor/helpers`: it is a git submodule" in course.notice()
    assert not (course.home / "gpu101" / "vendor").exists()


# ---- the executable bit --------------------------------------------------------------------------


def is_executable(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IXUSR)


def test_executable_files_stay_executable_in_homes(course, capsys):
    author = course.author
    author.write("run.sh", "#!/bin/sh\necho run\n")
    (author.work / "run.sh").chmod(0o755)
    author.write("tools/setup.sh", "#!/bin/sh\necho setup\n")  # from Windows: no mode bits
    author.write("notes.md", "read me")
    author.commit_and_push("scripts")
    course.publisher.sync(course.repo)
    course.start(capsys)
    home = course.home / "gpu101"
    assert is_executable(home / "run.sh")
    assert not is_executable(home / "notes.md") and not is_executable(home / "tools/setup.sh")

    author.git("update-index", "--chmod=+x", "tools/setup.sh")  # how Windows authors fix it
    course.push("setup.sh executable", add=False)
    out, _ = course.start(capsys)
    assert "3 keep" in out
    assert is_executable(home / "tools/setup.sh"), "a mode change alone reaches the home"

    (home / "run.sh").write_text("#!/bin/sh\necho mine\n")  # the participant's edit
    author.write("run.sh", "#!/bin/sh\necho run twice\n")
    course.push("run.sh changed")
    course.start(capsys)
    (beside,) = home.glob("run.new-*.sh")
    assert is_executable(beside), "a new version beside an edit is executable too"


# ---- a file that becomes a folder, and back ------------------------------------------------------


def test_a_file_that_becomes_a_folder_and_back_leaves_nothing_behind(course, capsys):
    author = course.author
    author.write("data", "a file at first\n")
    author.write("01-intro.ipynb", "{}")
    course.push("data is a file")
    course.start(capsys)

    (author.work / "data").unlink()
    author.write("data/table.csv", "a,b\n")
    author.write("data/more/deep.csv", "c,d\n")
    course.push("data is a folder")
    out, err = course.start(capsys)
    assert "2 copy" in out and "1 remove" in out and "failed" not in out, err
    assert (course.home / "gpu101/data/table.csv").read_text() == "a,b\n"

    author.git("rm", "-rq", "data")
    author.write("data", "a file again\n")
    course.push("data is a file again")
    out, err = course.start(capsys)
    assert "1 copy" in out and "2 remove" in out and "failed" not in out, err
    assert (course.home / "gpu101/data").read_text() == "a file again\n"
    assert sorted(course.home_files()) == ["01-intro.ipynb", "data"], "no empty folder"
    assert not [p for p in course.home.rglob("*") if p.is_dir() and not any(p.iterdir())]
    assert not list(course.home.rglob("*.new-*")) and course.notice() == "", "no false notice"
    out, _ = course.start(capsys)
    assert "2 keep" in out


def test_a_folder_with_the_participants_files_is_kept_when_it_becomes_a_file(course, capsys):
    author = course.author
    author.write("data/table.csv", "a,b\n")
    course.push("data is a folder")
    course.start(capsys)
    (course.home / "gpu101/data/my-results.csv").write_text("mine")
    (course.home / "gpu101/data/table.csv").write_text("a,b\n1,2\n")  # edited

    author.git("rm", "-rq", "data")
    author.write("data", "a file now\n")
    course.push("data is a file")
    out, err = course.start(capsys)
    assert "1 beside" in out and "failed" not in out, err
    assert (course.home / "gpu101/data/my-results.csv").read_text() == "mine"
    assert (course.home / "gpu101/data/table.csv").read_text() == "a,b\n1,2\n"
    (beside,) = (course.home / "gpu101").glob("data.new-*")
    assert beside.read_text() == "a file now\n"
    assert "(your home has a folder or link there)" in course.notice()
    out, _ = course.start(capsys)
    assert "1 keep" in out and not (course.home / "gpu101" / "data.new-x").exists()


# ---- long names ----------------------------------------------------------------------------------


def test_names_up_to_255_bytes_reach_homes_longer_ones_are_said(course, capsys):
    author = course.author
    near = "Übung-" + "λ" * 120 + ".ipynb"  # 253 bytes, 127 characters: fine everywhere
    over = "Εισαγωγή-" + "λ" * 120 + ".ipynb"  # 263 bytes: a Windows name Linux cannot hold
    assert len(near.encode()) == 253 and len(over.encode()) == 263
    author.write(near, '{"v": 1}')
    author.git("add", "-A")
    add_by_plumbing(author, f"lessons/{over}", b'{"v": 1}')
    course.push("long names", add=False)
    skipped = course.manifest()["skipped"]
    assert set(skipped) == {f"lessons/{over}"}
    assert "has a name of 263 bytes" in skipped[f"lessons/{over}"]
    assert "shorten it" in skipped[f"lessons/{over}"]
    assert not (course.version / "lessons").exists()

    out, err = course.start(capsys)
    assert "1 copy" in out and "failed" not in out, err
    assert (course.home / "gpu101" / near).read_text() == '{"v": 1}'
    assert "has a name of 263 bytes" in course.notice()

    (course.home / "gpu101" / near).write_text('{"v": "mine"}')
    author.write(near, '{"v": 2}')
    course.push("v2", add=True)
    out, err = course.start(capsys)
    assert "1 beside" in out and "failed" not in out, err
    (beside,) = (course.home / "gpu101").glob("*.new-*")
    assert len(beside.name.encode()) <= 255 and beside.read_text() == '{"v": 2}'
    argv = ["--share", str(course.publisher.root), "--home", str(course.home)]
    argv += ["--state", str(course.state), "--reset", f"gpu101/{near}"]
    assert start_hook.main(argv) == 0
    (mine,) = (course.home / "gpu101").glob("*.mine-*")
    assert mine.read_text() == '{"v": "mine"}'
    assert (course.home / "gpu101" / near).read_text() == '{"v": 2}'


# ---- a full home ---------------------------------------------------------------------------------


@pytest.fixture
def small_home(course):
    """The participant's home on a filesystem of 600 KiB (a tmpfs in the suite's own mount
    namespace: tests/hermetic.sh), as a home volume or NFS export that fills up."""
    if not os.environ.get("GPUHUB_HERMETIC_RUN"):
        pytest.skip("mounts a small filesystem only in tests/hermetic.sh's mount namespace")
    home = course.home.parent
    home.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=600k,mode=755", "gpuhub-small-home", str(home)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode:
        pytest.fail(f"could not mount a small filesystem for the home: {mounted.stderr}")
    yield home
    subprocess.run(["umount", "-l", str(home)], check=True)


def everything(folder: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``folder``."""
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in folder.rglob("*")
    }


def test_a_full_home_gets_no_partial_copies_and_the_server_starts(course, small_home, capsys):
    author = course.author
    author.write("01-intro.ipynb", '{"cells": []}')
    author.write("data/a-big.bin", os.urandom(200 * 1024))
    author.write("data/b-bigger/table.bin", os.urandom(300 * 1024))
    author.write("data/c-small.csv", "a,b\n")
    author.write("z-last.ipynb", "{}")
    course.push("data")
    mine = small_home / "tutorials" / "gpu101" / "my-work"
    mine.mkdir(parents=True)
    (mine / "results.npy").write_bytes(os.urandom(150 * 1024))
    (small_home / "notes.txt").write_text("my notes")
    before = everything(small_home)

    out, err = course.start(capsys)  # the hook's exit code is 0: the server starts
    assert "Traceback" not in err
    full = [line for line in err.splitlines() if "your home is full" in line]
    assert len(full) == 1, err
    assert (
        "3 file(s) not copied: gpu101/data/b-bigger/table.bin, gpu101/data/c-small.csv, "
        in (full[0])
    )
    assert "gpu101/z-last.ipynb" in full[0] and "restart your server" in full[0]
    assert "2 copy, 3 failed" in out
    after = everything(small_home)
    assert {p: after.get(p) for p in before} == before, "the participant's files are intact"
    made = sorted(set(after) - set(before))
    assert made == [
        ".local",
        ".local/tutorials.json",
        "tutorials/UPDATED-TUTORIALS.md",
        "tutorials/gpu101/01-intro.ipynb",
        "tutorials/gpu101/data",
        "tutorials/gpu101/data/a-big.bin",
    ], "no partial copy, no temporary file, no folder made for a copy that failed"
    assert "your home is full" in course.notice()

    (mine / "results.npy").unlink()  # the participant makes room
    out, err = course.start(capsys)
    assert "3 copy, 2 keep" in out and "full" not in err
    assert (
        course.home_files()["data/b-bigger/table.bin"]
        == (author.work / "data/b-bigger/table.bin").read_bytes()
    )


@pytest.mark.parametrize("code", [errno.EDQUOT, errno.ENOSPC])
def test_a_quota_reached_mid_copy_leaves_nothing_half_written(course, monkeypatch, capsys, code):
    """Quotas (EDQUOT) cannot be set up here: the copy is stopped half-way at its one write
    call, as a quota stops it."""
    author = course.author
    author.write("01-intro.ipynb", "{}")
    author.write("02-train.ipynb", "{}")
    author.write("data/big.bin", os.urandom(4096))
    course.push("data")
    copy = shutil.copyfileobj

    def copy_until_the_quota(src, dst, length=0):
        if Path(dst.name).parent.name == "data":
            dst.write(src.read(1000))
            dst.flush()
            raise OSError(code, os.strerror(code))
        copy(src, dst, length)

    monkeypatch.setattr(start_hook.shutil, "copyfileobj", copy_until_the_quota)
    out, err = course.start(capsys)
    assert "Traceback" not in err
    assert f"your home is full ({os.strerror(code)}): 1 file(s) not copied: gpu101/data/big" in err
    assert sorted(everything(course.home)) == [
        start_hook.NOTICE,
        "gpu101",
        "gpu101/01-intro.ipynb",
        "gpu101/02-train.ipynb",
    ], "no partial copy, no folder for it"
    monkeypatch.undo()
    out, _ = course.start(capsys)
    assert "1 copy, 2 keep" in out


def test_the_notice_says_what_is_still_true_and_goes_when_nothing_is(course, capsys):
    author = course.author
    author.write(".gitattributes", LFS_TRACK.format(pattern="*.pt"))
    author.write("model.pt", lfs_pointer(b"weights"))
    author.write("01-intro.ipynb", '{"v": 1}')
    course.push("first")
    course.start(capsys)
    assert "`gpu101/model.pt`: it is a Git LFS pointer" in course.notice()
    (course.home / "gpu101/01-intro.ipynb").write_text('{"v": "mine"}')
    author.write("01-intro.ipynb", '{"v": 2}')
    course.push("second")
    course.start(capsys)
    course.start(capsys)  # nothing new: what was said and is still true stays said
    notice = course.notice()
    assert "`gpu101/01-intro.ipynb`: new version in `gpu101/01-intro.new-" in notice
    assert "`gpu101/model.pt`: it is a Git LFS pointer" in notice

    (author.work / ".gitattributes").unlink()
    author.write("model.pt", b"weights")  # committed without LFS, as the notice advised
    course.push("model without LFS")
    out, _ = course.start(capsys)
    assert "1 copy" in out and (course.home / "gpu101/model.pt").read_bytes() == b"weights"
    notice = course.notice()
    assert "model.pt" not in notice and "`gpu101/01-intro.ipynb`: new version in" in notice

    (beside,) = (course.home / "gpu101").glob("01-intro.new-*")
    beside.unlink()  # the participant took what they wanted from it
    course.start(capsys)
    assert not (course.home / start_hook.NOTICE).exists(), "nothing left to say"
