"""The start-up script that joins a new GPU machine by itself (deploy/cloud_init.py), made from
the join line `make join-command` prints (deploy.steps.join_command): valid cloud-config, the
join line inside word for word and quoted right, valid shell, and what it refuses."""

from __future__ import annotations

import io
import shlex
import subprocess

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
