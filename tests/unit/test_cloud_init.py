"""The start-up script that joins a new GPU machine by itself (deploy/cloud_init.py), made from
the join line `make join-command` prints (deploy.steps.join_command): valid cloud-config, the
join line inside word for word and quoted right, valid shell, and what it refuses."""

from __future__ import annotations

import io
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


def test_the_mount_runs_in_a_shell_as_written(tmp_path):
    """The mount lines run by bash with the system's commands faked: fstab gets its line once
    (a second run adds none), a server that never answers stops before the join."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    for name, body in {
        "mount.nfs": "exit 0",
        "mountpoint": "exit 1",
        "mount": f'echo "mount $*" >>{calls}; exit "${{MOUNT_RC:-0}}"',
        "mkdir": f'echo "mkdir $*" >>{calls}',
        "sleep": f'echo "sleep $*" >>{calls}',
    }.items():
        (fake / name).write_text(f"#!/bin/bash\n{body}\n")
        (fake / name).chmod(0o755)
    fstab = tmp_path / "fstab"
    fstab.write_text("# a comment\nUUID=1 / ext4 defaults 0 1\n")
    lines = cloud_init.mount_lines([cloud_init.parse_nfs(NFS)])
    body = "\n".join(lines).replace("/etc/fstab", str(fstab)) + "\necho joined\n"
    env = {"PATH": f"{fake}:/usr/bin:/bin"}

    def run(**extra):
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", body],
            env={**env, **extra},
            capture_output=True,
            text=True,
        )

    for _ in range(2):
        done = run()
        assert done.returncode == 0 and done.stdout.endswith("joined\n"), done
    assert fstab.read_text().count("/srv/gpuhub nfs4") == 1
    assert calls.read_text().count("mount -o retry=0 /srv/gpuhub\n") == 2
    calls.unlink()
    refused = run(MOUNT_RC="32")
    assert refused.returncode == 1 and "joined" not in refused.stdout
    assert "could not mount 10.0.0.5:/srv/gpuhub at /srv/gpuhub after 5 tries" in refused.stdout
    assert "mounting 10.0.0.5:/srv/gpuhub failed (try 4 of 5)" in refused.stdout
    assert calls.read_text().count("mount -o retry=0") == 5
    assert calls.read_text().count("sleep 30") == 4


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
