"""The start-up script that joins a new GPU machine by itself (deploy/cloud_init.py), made from
the join line `make join-command` prints (deploy.steps.join_command): valid cloud-config, the
join line inside word for word and quoted right, valid shell, and what it refuses."""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy import cloud_init, steps
from deploy.cloud_init import JoinLineError, join_script, join_words, user_data
from gpu_swarm_spawner import contract

TOKEN = "SWMTKN-1-3pu6hszjas19xyp7ghgosyx9k8atbfcr8p2is99znpy26u2lkl-1awxwuwd3z9j1z3puu7rcgdbx"
REPOSITORY = "https://github.com/example/gpu-jupyterhub.git"


def printed(**extra) -> str:
    """What `make join-command` prints, as deploy.steps makes it."""
    return steps.join_command(
        "10.0.0.5", TOKEN, 3, contract.SINGLEUSER_IMAGE, registry="10.0.0.5:5000", **extra
    )


def the_script(data: str) -> str:
    document = yaml.safe_load(data)
    [written] = document["write_files"]
    assert written["path"] == "/opt/gpu-jupyterhub/join.sh"
    assert document["runcmd"] == [["/opt/gpu-jupyterhub/join.sh"]]
    return written["content"]


def test_the_user_data_is_cloud_config_holding_the_join_script():
    data = user_data(printed(), REPOSITORY)
    assert data.startswith("#cloud-config\n")
    document = yaml.safe_load(data)
    assert document["write_files"][0]["permissions"] == "0700"  # it holds the token
    assert the_script(data) == join_script(join_words(printed()), REPOSITORY, "main", False)


def test_the_join_line_is_inside_word_for_word_without_sudo():
    line = printed().splitlines()[-1]
    assert line.startswith("sudo ./worker_setup/setup.sh --manager 10.0.0.5:2377 --token ")
    script = the_script(user_data(printed(), REPOSITORY))
    # marked as a machine of the cloud's group, which the hub may give back
    assert f"  if {line.removeprefix('sudo ')} --fleet-group; then exit 0; fi\n" in script
    assert "sudo" not in script
    assert "--fleet-group" not in line  # the printed line joins a fixed machine, by hand
    assert join_words(line + " --fleet-group").count("--fleet-group") == 1


def test_words_a_shell_would_split_or_expand_stay_one_word_each():
    odd = printed(shared=" --shared-folder '/srv/our homes=4f2a'", guard=" --guard-mode 'warn'")
    odd = odd.replace("--slices-per-gpu 3", "--slices-per-gpu 3 --image 'su:$(reboot)'")
    words = join_words(odd)
    assert "/srv/our homes=4f2a" in words and "su:$(reboot)" in words
    script = the_script(user_data(odd, REPOSITORY))
    [loop] = [line for line in script.splitlines() if line.startswith("  if ./worker_setup")]
    emitted = loop.removeprefix("  if ").removesuffix("; then exit 0; fi")
    assert shlex.split(emitted) == words
    assert "'su:$(reboot)'" in emitted  # single-quoted: nothing is run


def test_the_script_is_valid_shell_and_checks_out_the_repository_at_its_ref(tmp_path):
    for aws in (False, True):
        script = join_script(join_words(printed()), REPOSITORY, "v1.4", aws)
        path = tmp_path / "join.sh"
        path.write_text(script)
        checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        assert script.startswith("#!/bin/bash\n") and "set -euo pipefail\n" in script
        assert f"git clone --quiet {REPOSITORY} /opt/gpu-jupyterhub/checkout\n" in script
        assert "fetch --quiet origin v1.4\n" in script
        assert "for try in $(seq 5); do\n" in script
    spaced = join_script(join_words(printed()), "/srv/our repos/hub.git", "main", False)
    assert "git clone --quiet '/srv/our repos/hub.git' /opt/" in spaced


def test_on_aws_the_machine_takes_its_instance_id_as_its_name_before_it_joins():
    named = join_script(join_words(printed()), REPOSITORY, "main", True)
    assert "X-aws-ec2-metadata-token-ttl-seconds" in named  # IMDSv2
    assert named.index('hostnamectl set-hostname "$id"') < named.index("./worker_setup/setup.sh")
    assert "systemctl restart docker" in named
    plain = join_script(join_words(printed()), REPOSITORY, "main", False)
    assert "hostnamectl" not in plain and "169.254.169.254" not in plain


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "found 0 lines that are not comments"),
        ("sudo ./worker_setup/setup.sh --manager a:2377 --token T\nls\n", "found 2 lines"),
        ("sudo ./worker_setup/setup.sh --manager a:2377\n", "must run ./worker_setup/setup.sh"),
        ("sudo rm -rf / --manager a --token T\n", "not a join line"),
        ("./worker_setup/setup.sh --manager a --token T --image-tar su.tar\n", "no --image-tar"),
        ("./worker_setup/setup.sh --manager a --token T --dry-run\n", "no place in a start-up"),
        ("./worker_setup/setup.sh --manager a --token 'T\n", "cannot be read as a shell line"),
    ],
)
def test_what_is_not_a_usable_join_line_is_refused_with_what_to_give(text, said):
    with pytest.raises(JoinLineError, match=said):
        user_data(text, REPOSITORY)


def test_a_repository_must_be_named():
    with pytest.raises(JoinLineError, match="--repository URL"):
        user_data(printed(), "")


def test_the_command_reads_the_line_on_its_input(capsys):
    out = io.StringIO()
    argv = ["--repository", REPOSITORY, "--ref", "v2", "--name-by-instance-id"]
    assert cloud_init.main(argv, stdin=io.StringIO(printed()), stdout=out) == 0
    assert the_script(out.getvalue()) == join_script(join_words(printed()), REPOSITORY, "v2", True)
    assert cloud_init.main(["--repository", REPOSITORY], stdin=io.StringIO("ls\n")) == 1
    assert capsys.readouterr().err == (
        "error: not a join line: it must run ./worker_setup/setup.sh with --manager and "
        "--token, as 'make join-command' prints it\n"
    )


SHARED = (
    " --shared-folder /srv/gpuhub/tutorials=5f0c1a2b3c4d5e6f"
    " --shared-folder /srv/gpuhub/homes=5f0c1a2b3c4d5e6f"
)
NFS = "10.0.0.5:/srv/gpuhub"  # homes.md: the manager exports /srv/gpuhub, mounted at that path


def test_with_nfs_the_storage_is_mounted_at_every_boot_before_the_checkout_and_join(tmp_path):
    mounts = [cloud_init.parse_nfs(NFS)]
    script = the_script(user_data(printed(shared=SHARED), REPOSITORY, mounts=mounts))
    path = tmp_path / "join.sh"
    path.write_text(script)
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    line = "10.0.0.5:/srv/gpuhub /srv/gpuhub nfs4 rw,hard,_netdev 0 0"
    assert f"  echo '{line}' >>/etc/fstab\n" in script  # homes.md's line, no nofail
    assert "apt-get install -y -qq --no-install-recommends nfs-common\n" in script
    mount = script.index("mountpoint -q /srv/gpuhub || mount -o retry=0 /srv/gpuhub;")
    order = [
        script.index("exec >>/var/log/gpuhub-join.log 2>&1\n"),  # logged with the join
        script.index("command -v mount.nfs"),
        script.index("mkdir -p /srv/gpuhub\n"),
        script.index("/etc/fstab"),
        mount,
        script.index("git clone"),
        script.index("./worker_setup/setup.sh --manager"),
    ]
    assert order == sorted(order)
    # tried like the join, and a mount that never comes stops the script before the join
    tries = script[script.index("for try in $(seq 5); do\n") : script.index("git clone")]
    assert mount > script.index("for try in $(seq 5); do\n") and "sleep 30\n" in tries
    assert "    exit 1\n" in tries and "TCP 2049" in tries
    assert join_script(join_words(printed()), REPOSITORY, "main", False) == join_script(
        join_words(printed()), REPOSITORY, "main", False, []
    )
    plain = the_script(user_data(printed(shared=SHARED), REPOSITORY))
    assert "mount" not in plain and "fstab" not in plain  # without --nfs nothing changes


class Machine:
    """A machine's system commands and files, faked in ``tmp_path`` for a start-up script run
    by bash: each stand-in logs its call (and ``[drop-in]`` when Docker's drop-in is written
    by then) into ``calls``; the script's system paths are rewritten to the fakes' own."""

    def __init__(self, tmp_path: Path, systemd: bool = True):
        self.root, self.calls = tmp_path, tmp_path / "calls"
        self.fstab, self.run_systemd = tmp_path / "fstab", tmp_path / "run-systemd"
        self.fstab.write_text("# a comment\nUUID=1 / ext4 defaults 0 1\n")
        if systemd:
            self.run_systemd.mkdir()
        self.drop_in = tmp_path / "docker.service.d" / Path(cloud_init.DOCKER_DROP_IN).name
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        seen = f'$([ -f {self.drop_in} ] && echo " [drop-in]")'
        setup = f'#!/bin/bash\necho "join $*{seen}" >>{self.calls}\n'
        for name, body in {
            "mount.nfs": "exit 0",
            "mountpoint": "exit 1",
            "mount": f'echo "mount $*" >>{self.calls}; exit "${{MOUNT_RC:-0}}"',
            # real under tmp_path, logged elsewhere (the mount point)
            "mkdir": f'case "$2" in {tmp_path}/*) exec /bin/mkdir "$@" ;; esac\n'
            f'echo "mkdir $*" >>{self.calls}',
            "sleep": f'echo "sleep $*" >>{self.calls}',
            "systemctl": f'echo "systemctl $*{seen}" >>{self.calls}',
            "hostnamectl": f'echo "hostnamectl $*" >>{self.calls}',
            "curl": "echo i-0123456789abcdef0",
            # a clone is a checkout whose join line logs itself
            "git": f'if [ "$1" = clone ]; then /bin/mkdir -p "$4/.git" "$4/worker_setup"\n'
            f'  printf %s {shlex.quote(setup)} >"$4/{cloud_init.SETUP}"\n'
            f'  chmod +x "$4/{cloud_init.SETUP}"; fi',
        }.items():
            (self.bin / name).write_text(f"#!/bin/bash\n{body}\n")
            (self.bin / name).chmod(0o755)

    def here(self, script: str) -> str:
        for system, here in {
            "/etc/fstab": self.fstab,
            os.path.dirname(cloud_init.DOCKER_DROP_IN): self.drop_in.parent,
            "/run/systemd/system": self.run_systemd,
            cloud_init.LOG: self.root / "join.log",
            cloud_init.FOLDER: self.root / "opt",
        }.items():
            script = script.replace(system, str(here))
        return script

    def run(self, script: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", self.here(script)],
            env={"PATH": f"{self.bin}:/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
        )

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def test_the_mount_runs_in_a_shell_as_written(tmp_path):
    """The mount lines run by bash with the system's commands faked: fstab gets its line once
    (a second run adds none), a server that never answers stops before the join."""
    machine = Machine(tmp_path)
    body = "\n".join(cloud_init.mount_lines([cloud_init.parse_nfs(NFS)])) + "\necho joined\n"
    for _ in range(2):
        done = machine.run(body)
        assert done.returncode == 0 and done.stdout.endswith("joined\n"), done
    assert machine.fstab.read_text().count("/srv/gpuhub nfs4") == 1
    assert machine.called().count("mount -o retry=0 /srv/gpuhub") == 2
    machine.calls.unlink()
    refused = machine.run(body, MOUNT_RC="32")
    assert refused.returncode == 1 and "joined" not in refused.stdout
    assert "could not mount 10.0.0.5:/srv/gpuhub at /srv/gpuhub after 5 tries" in refused.stdout
    assert "mounting 10.0.0.5:/srv/gpuhub failed (try 4 of 5)" in refused.stdout
    assert machine.called().count("mount -o retry=0 /srv/gpuhub") == 5
    assert machine.called().count("sleep 30") == 4


DROP_IN = """# Written by the start-up script of the GPU hub (python3 -m deploy.cloud_init):
# Docker starts only once the shared storage is mounted (docs/homes.md).
[Unit]
RequiresMountsFor=/srv/gpuhub /mnt/data
"""


@pytest.mark.parametrize("aws", [False, True])
def test_docker_waits_for_the_storage_at_every_boot_from_before_it_starts_or_joins(tmp_path, aws):
    """The whole start-up script, run twice by bash on a faked machine: Docker's drop-in
    (RequiresMountsFor= each mount point: after the mounts, and not started without them) is
    written, and systemd made to read it, before the engine is restarted (AWS: its new name)
    or the join runs; a second run leaves the same drop-in and fstab lines."""
    machine = Machine(tmp_path)
    mounts = [cloud_init.parse_nfs(NFS), cloud_init.parse_nfs("10.0.0.6:/data=/mnt/data/")]
    script = join_script(join_words(printed(shared=SHARED)), REPOSITORY, "main", aws, mounts)
    for _ in range(2):
        done = machine.run(script)
        assert done.returncode == 0, (done, (tmp_path / "join.log").read_text())
    assert machine.drop_in.read_text() == DROP_IN
    assert [p.name for p in machine.drop_in.parent.iterdir()] == [machine.drop_in.name]
    assert machine.fstab.read_text().count(" nfs4 ") == 2
    called = machine.called()
    first = called[: len(called) // 2]
    assert called == first * 2  # the second run does as the first, nothing more
    systemd = [c for c in first if c.startswith(("systemctl", "join"))]
    restart = ["systemctl is-active --quiet docker [drop-in]", "systemctl restart docker [drop-in]"]
    assert systemd == [
        "systemctl daemon-reload [drop-in]",  # read now, not at the next boot
        *(restart if aws else []),
        f"join --manager 10.0.0.5:2377 --token {TOKEN} --slices-per-gpu 3 --registry "
        f"10.0.0.5:5000{SHARED} --fleet-group [drop-in]",
    ]
    # mounted after the drop-in is read: the mount unit from fstab is systemd's by then
    assert first.index("systemctl daemon-reload [drop-in]") < first.index(
        "mount -o retry=0 /srv/gpuhub"
    )


def test_without_systemd_running_the_drop_in_is_written_and_nothing_reloaded(tmp_path):
    machine = Machine(tmp_path, systemd=False)
    done = machine.run("\n".join(cloud_init.mount_lines([cloud_init.parse_nfs(NFS)])))
    assert done.returncode == 0, done
    assert machine.drop_in.read_text().endswith("\nRequiresMountsFor=/srv/gpuhub\n")
    assert not any(c.startswith("systemctl") for c in machine.called())


@pytest.mark.parametrize(
    ("value", "mount"),
    [
        (NFS, ("10.0.0.5", "/srv/gpuhub", "/srv/gpuhub")),
        ("10.0.0.5:/srv/gpuhub=/mnt/hub/", ("10.0.0.5", "/srv/gpuhub", "/mnt/hub")),
        (
            "fs-1.efs.eu-west-1.amazonaws.com:/=/srv/gpuhub",
            ("fs-1.efs.eu-west-1.amazonaws.com", "/", "/srv/gpuhub"),
        ),
        ("[fd00::5]:/srv/gpuhub", ("[fd00::5]", "/srv/gpuhub", "/srv/gpuhub")),
    ],
)
def test_an_nfs_option_names_server_export_and_mount_point(value, mount):
    assert cloud_init.parse_nfs(value) == (*mount, "rw,hard,_netdev")  # homes.md's options


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("/srv/gpuhub", "is not SERVER:/EXPORT=/MOUNTPOINT"),
        ("10.0.0.5:srv/gpuhub", "is not SERVER:/EXPORT=/MOUNTPOINT"),
        ("$(reboot):/srv/gpuhub", "is not SERVER:/EXPORT=/MOUNTPOINT"),
        ("10.0.0.5:/srv/our hub", "without spaces"),
        # systemd would read a quote or a % in the drop-in's RequiresMountsFor= as its own
        ("10.0.0.5:/srv/gpuhub=/srv/it's", "without spaces, quotes, backslashes or %"),
        ('10.0.0.5:/srv/gpuhub=/srv/"hub"', "without spaces, quotes, backslashes or %"),
        ("10.0.0.5:/srv/gpuhub=/srv/100%", "without spaces, quotes, backslashes or %"),
        ("10.0.0.5:/srv/gpuhub=srv/gpuhub", "'srv/gpuhub' is not an absolute path"),
        ("10.0.0.5:/srv/gpuhub=", "'' is not an absolute path"),
        ("fs-1.efs.eu-west-1.amazonaws.com:/", "cannot be mounted on /"),
    ],
)
def test_an_nfs_option_that_is_not_one_is_refused_with_an_example(value, said, capsys):
    with pytest.raises(JoinLineError, match=re.escape(said)):
        cloud_init.parse_nfs(value)
    argv = ["--repository", REPOSITORY, "--nfs", value]
    assert cloud_init.main(argv, stdin=io.StringIO(printed())) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --nfs {value!r}") and "e.g. --nfs 10.0.0.5:/srv/gpuhub" in err


def test_shared_folders_no_nfs_mounts_are_warned_of_with_the_option_to_add(capsys):
    def warned(*nfs, shared=SHARED):
        out = io.StringIO()
        argv = ["--repository", REPOSITORY] + [w for v in nfs for w in ("--nfs", v)]
        assert cloud_init.main(argv, stdin=io.StringIO(printed(shared=shared)), stdout=out) == 0
        assert out.getvalue().startswith("#cloud-config\n")  # a warning, not an error
        return capsys.readouterr().err

    assert warned() == (
        "warning: the join line names the shared folder(s) /srv/gpuhub/tutorials "
        "/srv/gpuhub/homes, which every machine of the group must have mounted before it joins, "
        "and no --nfs mounts them: the join refuses each machine whose image does not mount "
        "them itself. To mount the manager's NFS export at boot, add e.g. --nfs "
        "10.0.0.5:/srv/gpuhub (the export that holds them, mounted at the same path; "
        "docs/homes.md)\n"
    )
    assert warned(NFS) == ""
    assert warned("10.0.0.5:/srv/gpuhub/homes", "10.0.0.5:/srv/gpuhub/tutorials") == ""
    partly = warned("10.0.0.5:/srv/gpuhub/homes")
    assert "folder(s) /srv/gpuhub/tutorials, which" in partly
    assert "--nfs 10.0.0.5:/srv/gpuhub/tutorials" in partly
    assert "/srv/gpuhub/homes" not in partly
    assert warned("10.0.0.5:/srv/gpuhub/homes2=/srv/gpuhub/home") != ""  # not a parent: homes
    assert warned(shared="") == ""  # no shared folders: nothing to mount


def test_a_mount_point_is_named_once(capsys):
    argv = ["--repository", REPOSITORY, "--nfs", NFS, "--nfs", "10.0.0.6:/x=/srv/gpuhub/"]
    assert cloud_init.main(argv, stdin=io.StringIO(printed())) == 1
    assert "name the same mount point" in capsys.readouterr().err


def test_nfs_options_replace_the_fstab_options_of_each_mount(capsys):
    efs = "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev"
    out = io.StringIO()
    argv = ["--repository", REPOSITORY, "--nfs", "fs-1.efs.eu-west-1.amazonaws.com:/=/srv/gpuhub"]
    assert (
        cloud_init.main([*argv, "--nfs-options", efs], stdin=io.StringIO(printed()), stdout=out)
        == 0
    )
    line = f"fs-1.efs.eu-west-1.amazonaws.com:/ /srv/gpuhub nfs4 {efs} 0 0"
    assert f"  echo '{line}' >>/etc/fstab\n" in the_script(out.getvalue())
    for bad in ("", "rw, hard", "rw,'x"):
        assert cloud_init.main([*argv, "--nfs-options", bad], stdin=io.StringIO(printed())) == 1
        assert "is not a list of mount options without spaces" in capsys.readouterr().err


def test_the_warning_autoscaling_md_shows_is_the_one_printed(capsys):
    shown = [
        line
        for line in (Path(__file__).parents[2] / "docs/autoscaling.md").read_text().splitlines()
        if line.startswith("warning: the join line names")
    ]
    cloud_init.main(["--repository", REPOSITORY], stdin=io.StringIO(printed(shared=SHARED)))
    assert shown == [capsys.readouterr().err.rstrip("\n")]


RECIPES = Path(__file__).parents[2] / "docs" / "providers"


def start_up_command(recipe: str) -> list[str]:
    """The arguments of the start-up script's command a recipe's comments give (after
    ``python3 -m deploy.cloud_init``, its continuation lines joined)."""
    lines = [line.removeprefix("#").strip() for line in recipe.splitlines() if line[:1] == "#"]
    first = next(i for i, line in enumerate(lines) if "python3 -m deploy.cloud_init" in line)
    command = []
    for line in lines[first:]:
        command.append(line.removesuffix("\\"))
        if not line.endswith("\\"):
            break
    words = shlex.split(" ".join(command))
    return words[words.index("deploy.cloud_init") + 1 :]


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.env")), ids=lambda p: p.stem)
def test_each_recipes_start_up_script_mounts_its_shared_homes(recipe, capsys):
    """A fleet needs shared homes (a machine given back goes with its disk): the command each
    recipe gives for the group's start-up script mounts its GPUHUB_HOMES_DIR before the join,
    with no warning, and holds Docker back until it is mounted."""
    text = recipe.read_text()
    [homes] = re.findall(r"^GPUHUB_HOMES_DIR=(\S+)$", text, re.M)
    argv = start_up_command(text)
    assert "--nfs" in argv
    assert ("--name-by-instance-id" in argv) == (recipe.stem == "aws")  # its remove command's
    out = io.StringIO()
    line = printed(shared=f" --shared-folder {homes}=5f0c1a2b3c4d5e6f")
    assert cloud_init.main(argv, stdin=io.StringIO(line), stdout=out) == 0
    assert capsys.readouterr().err == ""  # no shared folder left unmounted
    held_back = "\n".join(cloud_init.docker_drop_in_lines(["/srv/gpuhub"]))
    assert held_back in the_script(out.getvalue())
