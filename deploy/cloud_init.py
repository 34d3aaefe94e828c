"""The start-up script that joins a new GPU machine by itself: cloud-init user data made from the
join line ``make join-command`` prints (docs/autoscaling.md). Pure, standard library only;
``main`` reads the line on standard input:

    sudo make join-command | python3 -m deploy.cloud_init --repository URL [--ref main]
        [--name-by-instance-id]

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

The user data holds the swarm's worker token, as the join line does: whoever can read the
group's launch template or a machine's user data can join the swarm as a worker. Keep both to
the organizers, and block the metadata address for participants (the hub's servers never
reach it: docs/participants.md).
"""

from __future__ import annotations

import argparse
import shlex
import sys

SETUP = "./worker_setup/setup.sh"
#: The join's option that marks a machine of the cloud's group (worker_setup/__main__.py).
FLEET_GROUP = "--fleet-group"
FOLDER = "/opt/gpu-jupyterhub"
LOG = "/var/log/gpuhub-join.log"
#: Tries of the join while the manager does not answer yet, and the seconds between them.
TRIES, PAUSE_S = 5, 30


class JoinLineError(ValueError):
    """Not a join line this can use; the message says what to give instead."""


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


def join_script(words: list[str], repository: str, ref: str, name_by_instance_id: bool) -> str:
    """The shell script a new machine runs once, at its first boot."""
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
        "if ! command -v git >/dev/null; then",
        "  export DEBIAN_FRONTEND=noninteractive",
        "  apt-get update -qq",
        "  apt-get install -y -qq --no-install-recommends git ca-certificates",
        "fi",
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
    printed: str, repository: str, ref: str = "main", name_by_instance_id: bool = False
) -> str:
    """The ``#cloud-config`` user data that joins a machine with the join line in ``printed``
    (what ``make join-command`` printed)."""
    script = join_script(join_words(printed), repository, ref, name_by_instance_id)
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
    args = parser.parse_args(argv)
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        text = user_data(stdin.read(), args.repository, args.ref, args.name_by_instance_id)
    except JoinLineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
