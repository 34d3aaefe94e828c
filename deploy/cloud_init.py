"""The start-up script that joins a new GPU machine by itself: cloud-init user data made from the
join line ``make join-command`` prints (docs/autoscaling.md). Pure, standard library only;
``main`` reads the line on standard input:

    sudo make join-command | python3 -m deploy.cloud_init --repository URL [--ref main]
        [--name-by-instance-id] [--nfs SERVER:/EXPORT[=/MOUNTPOINT] ... [--nfs-options OPTS]]

It prints a ``#cloud-config`` document to paste into the cloud group's launch template (AWS
user data, Google Cloud ``user-data`` metadata, Azure custom data). At the machine's first boot
cloud-init writes ``/opt/gpu-jupyterhub/join.sh`` and runs it as root: git if missing, a
checkout of ``--repository`` at ``--ref`` in ``/opt/gpu-jupyterhub/checkout``, then the join
line itself (without ``sudo``) with ``--fleet-group`` added, tried again a few times while the
manager does not answer; its output goes to ``/var/log/gpuhub-join.log``. ``--fleet-group``
marks the machine as one of the cloud's group (the engine label ``gpu-jupyterhub.fleet=group``):
the hub's fleet keeper counts it in the group's size and may give it back, where a machine
joined by hand with the printed line is fixed (docs/autoscaling.md). With
``--name-by-instance-id`` (AWS) the machine first takes its EC2 instance id as its hostname, so
that the hub's remove command can name it.

With ``--nfs SERVER:/EXPORT=/MOUNTPOINT`` (``=/MOUNTPOINT`` left out: the export's own path, as
docs/homes.md lays the manager's ``/srv/gpuhub`` out), first of all the script mounts the
shared storage that the join line's ``--shared-folder`` folders are on: the NFS client if
missing (``nfs-common``, apt-get), the mount point, a line in ``/etc/fstab`` so that a reboot
mounts it again (``nfs4 rw,hard,_netdev``, homes.md's line, or ``--nfs-options``) and the
mount, tried again a few times while the server does not answer. The line has no ``nofail``:
with ``_netdev`` a remote mount that fails does not stop the boot anyway (systemd's
remote-fs.target fails, no emergency shell), and ``nofail`` would only hide the failure. A
mount that never succeeds stops the script before the join, with a line in the log that says
what to check. The join checks the storage once; at a later boot the script does not run, so
a drop-in for Docker's unit (``DOCKER_DROP_IN``: ``RequiresMountsFor=`` each mount point) keeps
the engine from starting until the storage is mounted. Without it a machine rebooted while the
server is down would rejoin the swarm with empty local folders at the shared folders' paths,
and a server placed there would write its participant's files to this machine's disk. With it
the machine stays out of the swarm (its node down) until the storage is back
(docs/homes.md: after a reboot). Without ``--nfs`` the machine's image must mount the storage;
``main`` warns when the join line names shared folders that no ``--nfs`` covers.

The user data holds the swarm's worker token, as the join line does: whoever can read the
group's launch template or a machine's user data can join the swarm as a worker. Keep both to
the organizers, and block the metadata address for participants (the hub's servers never
reach it: docs/participants.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import NamedTuple

SETUP = "./worker_setup/setup.sh"
#: The join's option that marks a machine of the cloud's group (worker_setup/__main__.py).
FLEET_GROUP = "--fleet-group"
FOLDER = "/opt/gpu-jupyterhub"
LOG = "/var/log/gpuhub-join.log"
#: Tries of the join while the manager does not answer yet, and the seconds between them.
TRIES, PAUSE_S = 5, 30
#: The join's option naming a folder the machine must have (worker_setup/shared_folders.py).
SHARED_FOLDER = "--shared-folder"
#: The options of the shared storage's line in /etc/fstab unless --nfs-options says others
#: (docs/homes.md's line for a GPU machine; no ``nofail``: see the module's doc).
NFS_OPTIONS = "rw,hard,_netdev"
#: An NFS server as /etc/fstab names it: a host name, an IPv4 address or an IPv6 one in [].
SERVER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]")
#: The drop-in that holds Docker's engine back at boot until the shared storage is mounted.
#: ``RequiresMountsFor=`` adds Requires= and After= on each path's mount unit (systemd.unit(5)):
#: ordered after the mount, and not started when it fails. In /etc/fstab it would take two
#: options (``x-systemd.before=`` only orders, ``x-systemd.required-by=`` only requires) on a
#: line the script leaves as it is when there is one already; the drop-in is written whole.
DOCKER_DROP_IN = "/etc/systemd/system/docker.service.d/gpu-jupyterhub-shared-storage.conf"


class JoinLineError(ValueError):
    """Not a join line this can use; the message says what to give instead."""


class Mount(NamedTuple):
    """One ``--nfs``: the NFS server, the path it exports and where this machine mounts it."""

    server: str
    export: str
    point: str
    options: str = NFS_OPTIONS

    @property
    def fstab_line(self) -> str:
        return f"{self.server}:{self.export} {self.point} nfs4 {self.options} 0 0"


def parse_nfs(value: str, options: str = NFS_OPTIONS) -> Mount:
    """``SERVER:/EXPORT[=/MOUNTPOINT]`` as a Mount with the /etc/fstab ``options``;
    JoinLineError, saying what to write, for anything else."""
    if not options or any(c.isspace() or c in "\\'" for c in options):
        raise JoinLineError(
            f"--nfs-options {options!r} is not a list of mount options without spaces, e.g. "
            f"{NFS_OPTIONS} (docs/homes.md gives AWS EFS's)"
        )
    source, equals, point = value.partition("=")
    server, colon, export = source.partition(":/")
    export = "/" + export if colon else ""
    example = "e.g. --nfs 10.0.0.5:/srv/gpuhub=/srv/gpuhub (docs/homes.md)"
    if (
        not SERVER.fullmatch(server)
        or not export
        or any(c.isspace() or c in "\\'\"%" for c in value)
    ):
        raise JoinLineError(
            f"--nfs {value!r} is not SERVER:/EXPORT=/MOUNTPOINT (a host name or address, "
            f"and paths without spaces, quotes, backslashes or %, which /etc/fstab or systemd "
            f"would read otherwise); {example}"
        )
    if not equals:
        point = export
    if not point.startswith("/"):
        raise JoinLineError(
            f"--nfs {value!r}: the mount point {point!r} is not an absolute path; the hub's "
            f"folders are mounted at the same path on every machine, {example}"
        )
    point = os.path.normpath(point)
    if point == "/" or point.startswith("//"):
        raise JoinLineError(
            f"--nfs {value!r}: the storage cannot be mounted on /; name the folder it is "
            f"mounted at on the manager, {example}"
        )
    return Mount(server, export, point, options)


def shared_folders(words: list[str]) -> list[str]:
    """The folders the join line's ``--shared-folder PATH=ID`` options name."""
    found = []
    for index, word in enumerate(words):
        if word == SHARED_FOLDER and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith(SHARED_FOLDER + "="):
            value = word.removeprefix(SHARED_FOLDER + "=")
        else:
            continue
        found.append(os.path.normpath(value.rpartition("=")[0] or value))
    return found


def not_mounted(words: list[str], mounts: list[Mount]) -> list[str]:
    """The join line's shared folders that are neither a mount point of ``mounts`` nor inside
    one."""
    return [
        folder
        for folder in shared_folders(words)
        if not any(os.path.commonpath([folder, m.point]) == m.point for m in mounts)
    ]


def mount_warning(words: list[str], mounts: list[Mount]) -> str:
    """A warning when the join line names shared folders that no ``--nfs`` mounts ("" when
    none): the join refuses a machine without them, unless its image mounts them."""
    missing = not_mounted(words, mounts)
    if not missing:
        return ""
    manager = words[words.index("--manager") + 1].rpartition(":")[0] or "MANAGER"
    common = os.path.commonpath(missing)
    export = common if common != "/" else missing[0]
    return (
        f"warning: the join line names the shared folder(s) {' '.join(missing)}, which every "
        "machine of the group must have mounted before it joins, and no --nfs mounts them: "
        "the join refuses each machine whose image does not mount them itself. To mount the "
        f"manager's NFS export at boot, add e.g. --nfs {manager}:{export} (the export that "
        "holds them, mounted at the same path; docs/homes.md)"
    )


def apt_install(command: str, packages: str) -> list[str]:
    """Shell lines that install ``packages`` with apt-get when ``command`` is missing."""
    return [
        f"if ! command -v {command} >/dev/null; then",
        "  export DEBIAN_FRONTEND=noninteractive",
        "  apt-get update -qq",
        f"  apt-get install -y -qq --no-install-recommends {packages}",
        "fi",
    ]


def docker_drop_in_lines(points: list[str]) -> list[str]:
    """Shell lines that write ``DOCKER_DROP_IN`` for ``points`` (the whole file each time: a
    second run writes the same) and have systemd read it."""
    text = [
        "# Written by the start-up script of the GPU hub (python3 -m deploy.cloud_init):",
        "# Docker starts only once the shared storage is mounted (docs/homes.md).",
        "[Unit]",
        f"RequiresMountsFor={' '.join(points)}",
    ]
    return [
        "# at every boot Docker waits for the storage, and does not start without it",
        f"mkdir -p {os.path.dirname(DOCKER_DROP_IN)}",
        f"printf '%s\\n' {' '.join(shlex.quote(line) for line in text)} >{DOCKER_DROP_IN}",
        # the drop-in and the fstab line (its mount unit) are read now, not at the next boot
        "if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi",
    ]


def mount_lines(mounts: list[Mount]) -> list[str]:
    """Shell lines that mount each of ``mounts`` now and at every boot (its line in
    /etc/fstab, Docker's drop-in), tried ``TRIES`` times while the server does not answer; the
    script stops when one never mounts."""
    if not mounts:
        return []
    lines = [
        "# the shared storage the join checks for (docs/homes.md), mounted before the join",
        'export PATH="$PATH:/usr/sbin:/sbin"',
        "if ! command -v mount.nfs >/dev/null && ! command -v apt-get >/dev/null; then",
        '  echo "no NFS client (mount.nfs) and no apt-get to install nfs-common: install the '
        'NFS client in the image (nfs-utils on RHEL, Fedora, Amazon Linux, SUSE)"',
        "  exit 1",
        "fi",
        *apt_install("mount.nfs", "nfs-common"),
    ]
    for m in mounts:
        point = shlex.quote(m.point)
        lines += [
            f"mkdir -p {point}",
            # its line once, even when the script runs again
            f"if ! awk -v p={point} '$2 == p {{ n++ }} END {{ exit !n }}' /etc/fstab; then",
            f"  echo {shlex.quote(m.fstab_line)} >>/etc/fstab",
            "fi",
        ]
    lines += docker_drop_in_lines([m.point for m in mounts])
    for m in mounts:
        point = shlex.quote(m.point)
        source = f"{m.server}:{m.export}"
        given_up = (
            f"could not mount {source} at {m.point} after {TRIES} tries: check that the "
            "server exports it to this machine and that TCP 2049 is open from here "
            "(docs/homes.md); the join would refuse this machine"
        )
        lines += [
            f"for try in $(seq {TRIES}); do",
            # retry=0: mount.nfs tries once, this loop paces the tries (its default: 2 minutes)
            f"  if mountpoint -q {point} || mount -o retry=0 {point}; then break; fi",
            f'  if [ "$try" -eq {TRIES} ]; then',
            f"    echo {shlex.quote(given_up)}",
            "    exit 1",
            "  fi",
            f"  echo {shlex.quote(f'mounting {source} failed')}"
            f'" (try $try of {TRIES}); trying again in {PAUSE_S} s"',
            f"  sleep {PAUSE_S}",
            "done",
        ]
    return lines


def join_words(printed: str) -> list[str]:
    """The words the start-up script runs: the join line in what ``make join-command`` printed
    (its comment lines and ``sudo`` left out), with ``FLEET_GROUP`` added (a machine that
    joins by itself is the cloud group's)."""
    lines = [line.strip() for line in printed.splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    if len(commands) != 1:
        raise JoinLineError(
            f"expected the one join line 'make join-command' prints, found {len(commands)} "
            "lines that are not comments; give it exactly what that command printed"
        )
    try:
        words = shlex.split(commands[0])
    except ValueError as e:
        raise JoinLineError(f"the join line cannot be read as a shell line ({e})") from None
    if words[:1] == ["sudo"]:
        words = words[1:]
    if words[:1] != [SETUP] or "--manager" not in words or "--token" not in words:
        raise JoinLineError(
            f"not a join line: it must run {SETUP} with --manager and --token, as "
            "'make join-command' prints it"
        )
    if "--image-tar" in words:
        raise JoinLineError(
            "a machine that joins by itself has no --image-tar file; let it pull the image "
            "(make up's registry, or an image it can pull) and leave --image-tar out"
        )
    if "--leave" in words or "--dry-run" in words:
        raise JoinLineError("--leave and --dry-run have no place in a start-up script")
    return words if FLEET_GROUP in words else [*words, FLEET_GROUP]


def join_script(
    words: list[str],
    repository: str,
    ref: str,
    name_by_instance_id: bool,
    mounts: list[Mount] = (),
) -> str:
    """The shell script a new machine runs once, at its first boot: ``mounts`` first, then the
    checkout and the join."""
    if not repository:
        raise JoinLineError(
            "name the repository the machine checks out (--repository URL, e.g. the address "
            "'git remote get-url origin' prints in the manager's checkout)"
        )
    checkout = f"{FOLDER}/checkout"
    lines = [
        "#!/bin/bash",
        "# Joins this machine to the GPU hub's swarm; written by cloud-init at the first boot",
        "# (python3 -m deploy.cloud_init). Run again by hand to retry: it is safe to run twice.",
        "set -euo pipefail",
        f"exec >>{LOG} 2>&1",
        'echo "$(date -u +%FT%TZ) joining the GPU hub\'s swarm"',
        *mount_lines(list(mounts)),
        *apt_install("git", "git ca-certificates"),
        f"if [ ! -d {checkout}/.git ]; then",
        f"  git clone --quiet {shlex.quote(repository)} {checkout}",
        "fi",
        f"git -C {checkout} fetch --quiet origin {shlex.quote(ref)}",
        f"git -C {checkout} checkout --quiet --force FETCH_HEAD",
    ]
    if name_by_instance_id:
        lines += [
            "# the hub's remove command names this machine by its EC2 instance id (IMDSv2)",
            "token=$(curl -fsS -X PUT http://169.254.169.254/latest/api/token "
            '-H "X-aws-ec2-metadata-token-ttl-seconds: 60")',
            'id=$(curl -fsS -H "X-aws-ec2-metadata-token: $token" '
            "http://169.254.169.254/latest/meta-data/instance-id)",
            'hostnamectl set-hostname "$id"',
            "# an engine started before the new name would join the swarm under the old one",
            "if systemctl is-active --quiet docker; then systemctl restart docker; fi",
        ]
    lines += [
        f"cd {checkout}",
        f"for try in $(seq {TRIES}); do",
        f"  if {shlex.join(words)}; then exit 0; fi",
        f'  echo "the join failed (try $try of {TRIES}); trying again in {PAUSE_S} s"',
        f"  sleep {PAUSE_S}",
        "done",
        "exit 1",
    ]
    return "\n".join(lines) + "\n"


def user_data(
    printed: str,
    repository: str,
    ref: str = "main",
    name_by_instance_id: bool = False,
    mounts: list[Mount] = (),
) -> str:
    """The ``#cloud-config`` user data that joins a machine with the join line in ``printed``
    (what ``make join-command`` printed), after mounting ``mounts``."""
    script = join_script(join_words(printed), repository, ref, name_by_instance_id, mounts)
    content = "".join(f"      {line}\n" if line else "\n" for line in script.splitlines())
    return (
        "#cloud-config\n"
        "# Joins this machine to the GPU hub's swarm at its first boot (python3 -m\n"
        "# deploy.cloud_init). It holds the swarm's worker token: keep it to the organizers.\n"
        "write_files:\n"
        f"  - path: {FOLDER}/join.sh\n"
        '    permissions: "0700"\n'
        "    owner: root:root\n"
        "    content: |\n"
        f"{content}"
        "runcmd:\n"
        f"  - [{FOLDER}/join.sh]\n"
    )


def main(argv: list[str] | None = None, stdin=None, stdout=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m deploy.cloud_init",
        description="Print cloud-init user data that joins a new GPU machine by itself, from "
        "the join line 'make join-command' prints (read on standard input).",
    )
    parser.add_argument("--repository", required=True, help="the git address to check out")
    parser.add_argument("--ref", default="main", help="the branch, tag or commit (main)")
    parser.add_argument(
        "--name-by-instance-id",
        action="store_true",
        help="AWS: the machine takes its EC2 instance id as its hostname, which the remove "
        "command of docs/providers/aws.env takes",
    )
    parser.add_argument(
        "--nfs",
        action="append",
        default=[],
        metavar="SERVER:/EXPORT[=/MOUNTPOINT]",
        help="mount this NFS export before the join, at /MOUNTPOINT (the export's own path "
        "when left out) and at every boot, e.g. 10.0.0.5:/srv/gpuhub, the manager's export "
        "of docs/homes.md; once per export",
    )
    parser.add_argument(
        "--nfs-options",
        default=NFS_OPTIONS,
        metavar="OPTIONS",
        help=f"the mount options of each --nfs line in /etc/fstab ({NFS_OPTIONS}; AWS EFS: "
        "those docs/homes.md gives)",
    )
    args = parser.parse_args(argv)
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        mounts = [parse_nfs(value, args.nfs_options) for value in args.nfs]
        points = [m.point for m in mounts]
        if len(set(points)) < len(points):
            raise JoinLineError("two --nfs options name the same mount point; give each once")
        printed = stdin.read()
        text = user_data(printed, args.repository, args.ref, args.name_by_instance_id, mounts)
    except JoinLineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    warning = mount_warning(join_words(printed), mounts)
    if warning:
        print(warning, file=sys.stderr)
    stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
