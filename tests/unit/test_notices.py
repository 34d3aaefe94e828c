"""The GPU guard's notices in the single-user image (images/singleuser/gpuhub_notices, and the lab
extension: its sources in images/singleuser/labextension, its build under
images/singleuser/sys-prefix).

The reader is tested here on odd files; the server extension and the lab extension need Jupyter
Server and JupyterLab, which this venv has not: of them, the static facts are tested here (the
committed build is of the committed sources, stamp.py), and a real JupyterLab in a real browser
runs them in images/singleuser/check_notices.py and tests/integration/test_guard.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SINGLEUSER = REPO / "images" / "singleuser"
PACKAGE = SINGLEUSER / "gpuhub_notices"
PREFIX = SINGLEUSER / "sys-prefix"
LABEXTENSION = PREFIX / "share" / "jupyter" / "labextensions" / "gpuhub-notices"
SOURCE = SINGLEUSER / "labextension"  # the lab extension's sources; make labextension builds them

spec = importlib.util.spec_from_file_location("gpuhub_notices_reader", PACKAGE / "notices.py")
notices = importlib.util.module_from_spec(spec)
spec.loader.exec_module(notices)

spec = importlib.util.spec_from_file_location("gpuhub_usage_reader", PACKAGE / "usage.py")
usage = importlib.util.module_from_spec(spec)
spec.loader.exec_module(usage)

spec = importlib.util.spec_from_file_location("gpuhub_labextension_stamp", SOURCE / "stamp.py")
stamp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stamp)

NOW = 1_732_350_000.0


def entry(notice_id="warn-jy-alice-1", level="warning", **fields) -> dict:
    return {
        "id": notice_id,
        "level": level,
        "time": NOW,
        "title": "GPU memory over your budget",
        "message": "You use 9.2 GB of GPU memory; your budget is 4.0 GB.",
        **fields,
    }


def parse(*entries) -> list[dict]:
    return notices.parse_notices(json.dumps({"notices": list(entries)}))


def ids(found: list[dict]) -> list[str]:
    return [notice["id"] for notice in found]


# --- the reader ---------------------------------------------------------------------------------


def test_a_valid_file_gives_its_notices_with_the_fields_of_the_format_only():
    text = json.dumps({"notices": [entry(extra="dropped", time=NOW)], "version": 2})
    assert notices.parse_notices(text) == [
        {
            "id": "warn-jy-alice-1",
            "level": "warning",
            "time": NOW,
            "title": "GPU memory over your budget",
            "message": "You use 9.2 GB of GPU memory; your budget is 4.0 GB.",
        }
    ]


def test_every_level_of_the_format_is_kept_and_the_title_may_be_left_out():
    found = parse(entry("a", "info"), entry("b", "warning"), entry("c", "error"))
    assert [notice["level"] for notice in found] == ["info", "warning", "error"]
    untitled = {key: value for key, value in entry("d", "error").items() if key != "title"}
    assert parse(untitled)[0]["title"] == ""
    assert isinstance(parse(entry(time=1732350000))[0]["time"], float)


@pytest.mark.parametrize(
    "text",
    ["", "   ", "not JSON {", "null", "42", '"notices"', "[]",
     json.dumps([entry()]),  # a list of notices instead of the object
     "{}", '{"notices": null}', '{"notices": {"id": "x"}}', '{"Notices": []}',
     "[" * 100_000],  # nested too deep for the parser
    ids=["empty", "blank", "invalid", "null", "number", "string", "empty-list", "list-of-notices",
         "no-notices", "notices-null", "notices-object", "wrong-key", "deep"],
)  # fmt: skip
def test_a_file_of_another_shape_holds_no_notices(text):
    assert notices.parse_notices(text) == []


@pytest.mark.parametrize(
    "broken",
    [{"id": None}, {"id": ""}, {"id": "  "}, {"id": 7}, {"message": None}, {"message": ""},
     {"message": ["a"]}, {"level": "critical"}, {"level": None}, {"level": "WARNING"},
     {"time": None}, {"time": "1732350000"}, {"time": True}, {"time": float("nan")},
     {"time": float("inf")}, {"title": 3}],
    ids=lambda broken: f"{next(iter(broken))}={next(iter(broken.values()))!r}",
)  # fmt: skip
def test_a_malformed_entry_is_left_out_and_the_others_kept(broken):
    found = parse(entry("before"), entry("broken", **broken), entry("after"))
    assert ids(found) == ["before", "after"]


@pytest.mark.parametrize("missing", ["id", "message", "level", "time"])
def test_an_entry_missing_a_field_of_the_format_is_left_out(missing):
    incomplete = {key: value for key, value in entry("broken").items() if key != missing}
    assert ids(parse(entry("kept"), incomplete)) == ["kept"]


def test_entries_that_are_not_objects_are_left_out():
    text = json.dumps({"notices": ["warning", None, 3, [entry("nested")], entry("kept")]})
    assert ids(notices.parse_notices(text)) == ["kept"]


def test_only_the_last_twenty_are_kept_oldest_first():
    found = parse(*(entry(f"n{number}", time=NOW + number) for number in range(25)))
    assert ids(found) == [f"n{number}" for number in range(5, 25)]


def test_a_notice_listed_twice_keeps_its_last_version_in_its_last_place():
    found = parse(entry("a", message="first"), entry("b"), entry("a", message="rewritten"))
    assert ids(found) == ["b", "a"]
    assert found[1]["message"] == "rewritten"


def test_bytes_that_are_not_utf8_cost_a_character_not_the_notice():
    text = json.dumps({"notices": [entry(message="budget 4.0 GB XX")]}).encode()
    found = notices.parse_notices(text.replace(b"XX", b"\xff\xfe"))
    assert found[0]["message"] == "budget 4.0 GB \ufffd\ufffd"
    assert notices.parse_notices(b"\x00\xff\x81 garbage") == []
    assert notices.parse_notices(json.dumps({"notices": [entry(message="GPU à 90 %")]}).encode())


def test_reading_a_file(tmp_path):
    path = tmp_path / "notices.json"
    path.write_text(json.dumps({"notices": [entry()]}))
    assert ids(notices.read_notices(str(path))) == ["warn-jy-alice-1"]


@pytest.mark.parametrize("where", ["missing", "directory", "nul-in-path", "empty"])
def test_a_file_that_cannot_be_read_holds_no_notices(tmp_path, where):
    path = {"missing": tmp_path / "none.json", "directory": tmp_path,
            "nul-in-path": f"{tmp_path}/a\0b", "empty": tmp_path / "empty.json"}[where]  # fmt: skip
    (tmp_path / "empty.json").write_bytes(b"")
    assert notices.read_notices(str(path)) == []


def test_an_unreadable_file_holds_no_notices(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    path = tmp_path / "notices.json"
    path.write_text(json.dumps({"notices": [entry()]}))
    path.chmod(0)
    assert notices.read_notices(str(path)) == []


def test_a_file_larger_than_the_guard_writes_holds_no_notices(tmp_path):
    path = tmp_path / "notices.json"
    text = json.dumps({"notices": [entry()]})
    path.write_text(text + " " * (notices.MAX_BYTES - len(text)))
    assert len(notices.read_notices(str(path))) == 1
    path.write_text(text + " " * (notices.MAX_BYTES - len(text) + 1))
    assert notices.read_notices(str(path)) == []


def test_the_path_is_the_guards_unless_the_environment_names_another():
    assert notices.notices_path({}) == "/tmp/gpuhub-guard/notices.json"
    assert notices.notices_path({"GPUHUB_NOTICES_FILE": "/x/n.json"}) == "/x/n.json"


def test_gpu_info_shows_the_last_three_of_the_last_hour_or_else_the_last_one():
    found = parse(*(entry(f"n{age}", time=NOW - age * 600) for age in (9, 5, 4, 3, 1)))
    assert ids(notices.recent(found, NOW)) == ["n4", "n3", "n1"]
    old = parse(entry("older", time=NOW - 7200), entry("old", time=NOW - 3700))
    assert ids(notices.recent(old, NOW)) == ["old"]
    assert notices.recent([], NOW) == []


# --- the participant's own GPU figures (usage.json) -----------------------------------------------

FIGURES = {"time": NOW, "gpu": "GPU-a", "used_mb": 2150, "budget_mb": 8192, "gpu_utilization": 45.0,
           "gpu_memory_used_mb": 30500, "gpu_memory_total_mb": 81559}  # fmt: skip


def test_the_figures_read_as_the_guard_writes_them():
    assert usage.parse_usage(json.dumps({**FIGURES, "colour": "red"})) == {
        **FIGURES, "used_mb": 2150.0, "budget_mb": 8192.0, "gpu_memory_used_mb": 30500.0,
        "gpu_memory_total_mb": 81559.0, "time": NOW}  # fmt: skip
    no_gpu_figures = {**FIGURES, "budget_mb": None, "gpu_utilization": None}
    assert usage.parse_usage(json.dumps(no_gpu_figures))["gpu_utilization"] is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[1]",
        "null",
        json.dumps({**FIGURES, "gpu": ""}),
        json.dumps({k: v for k, v in FIGURES.items() if k != "used_mb"}),
        json.dumps({**FIGURES, "used_mb": -1}),
        json.dumps({**FIGURES, "used_mb": "2150"}),
        json.dumps({**FIGURES, "time": True}),
        json.dumps({**FIGURES, "budget_mb": 0}),
        json.dumps({**FIGURES, "gpu_utilization": 150}),
        json.dumps({**FIGURES, "used_mb": float("nan")}),  # json writes NaN, and reads it back
        "[" * 100_000,  # nested beyond the parser
    ],
)
def test_anything_else_in_the_usage_file_is_no_figures(text):
    assert usage.parse_usage(text) is None


def test_the_usage_file_missing_or_oversized_is_no_figures(tmp_path):
    assert usage.read_usage(str(tmp_path / "missing.json")) is None
    big = tmp_path / "usage.json"
    big.write_text(json.dumps({**FIGURES, "pad": "x" * usage.MAX_BYTES}))
    assert usage.read_usage(str(big)) is None
    big.write_text(json.dumps(FIGURES))
    assert usage.read_usage(str(big))["used_mb"] == 2150


def test_the_figures_in_words_over_budget_and_stale():
    assert usage.describe(usage.parse_usage(json.dumps(FIGURES)), NOW + 5) == (
        "GPU memory in use: 2.1 GB of your 8.0 GB budget (26%); the GPU is 45% busy (all its users)"
    )
    over = usage.parse_usage(json.dumps({**FIGURES, "used_mb": 10_000}))
    assert "(122%): OVER BUDGET" in usage.describe(over, NOW)
    assert usage.describe(over, NOW + usage.STALE_S + 1) == ""  # the guard went quiet
    assert usage.describe(None, NOW) == ""


# --- gpu-info and python3 -m gpuhub_notices ----------------------------------------------------


def run_gpu_info(
    tmp_path, file_text: str | None, usage_text: str = ""
) -> subprocess.CompletedProcess:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "python3").symlink_to(sys.executable)
    path = tmp_path / "notices.json"
    if file_text is not None:
        path.write_text(file_text)
    (tmp_path / "usage.json").write_text(usage_text)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "PYTHONPATH": str(SINGLEUSER), "GPU_UUID": "GPU-x",
           "GPUHUB_NOTICES_FILE": str(path), "GPUHUB_USAGE_FILE": str(tmp_path / "usage.json"),
           "TZ": "UTC"}  # fmt: skip
    return subprocess.run(
        ["sh", str(SINGLEUSER / "gpu-info")], env=env, capture_output=True, text=True, timeout=60
    )


def test_gpu_info_prints_the_latest_notices(tmp_path):
    text = json.dumps({"notices": [entry("a", time=time.time() - 60, title="Over your budget"),
                                   entry("b", "error", time=time.time(), title="Stopped pid 1234",
                                         message="word " * 40)]})  # fmt: skip
    result = run_gpu_info(tmp_path, text)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert "GPU guard notices (latest last):" in out
    assert out.index("warning: Over your budget") < out.index("error: Stopped pid 1234")
    assert "You use 9.2 GB of GPU memory" in out
    assert all(len(line) <= 100 for line in out.splitlines())  # the long message is wrapped


def test_gpu_info_says_how_much_gpu_memory_the_participant_uses_now(tmp_path):
    figures = json.dumps({**FIGURES, "time": time.time() - 5})
    result = run_gpu_info(tmp_path, None, figures)
    assert result.returncode == 0, result.stderr
    assert "GPU memory in use: 2.1 GB of your 8.0 GB budget (26%)" in result.stdout


@pytest.mark.parametrize("file_text", [None, "not JSON", '{"notices": []}'])
def test_gpu_info_says_nothing_of_notices_where_there_are_none(tmp_path, file_text):
    result = run_gpu_info(tmp_path, file_text)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "GPU:           GPU-x" in result.stdout
    assert "notice" not in result.stdout


# --- the server extension: its registration -----------------------------------------------------


def test_importing_the_package_needs_no_jupyter_and_names_the_extension():
    """gpu-info imports the package without Jupyter; Jupyter Server loads the module that
    jupyter_server_config.d enables, whose extension points must name it."""
    script = (
        "import json, sys, gpuhub_notices; "
        "assert not [name for name in sys.modules if name.startswith(('jupyter', 'tornado'))]; "
        "print(json.dumps(gpuhub_notices._jupyter_server_extension_points()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(SINGLEUSER)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    points = json.loads(result.stdout)
    assert points == [{"module": "gpuhub_notices"}]
    config = json.loads(
        (PREFIX / "etc/jupyter/jupyter_server_config.d/gpuhub_notices.json").read_text()
    )
    assert config == {"ServerApp": {"jpserver_extensions": {points[0]["module"]: True}}}


def test_the_handler_is_authenticated_authorized_and_not_activity():
    """Its source, as this venv has no jupyter_server to import it: the decorators jupyter_server
    2 asks of an API handler, and a poll every 5 s that keeps no server from the idle culler."""
    source = (PACKAGE / "handlers.py").read_text()
    get = re.search(r"((?:    @.*\n)+)    async def get\(self\)", source)
    assert get, "GuardFileHandler.get is gone"
    assert get.group(1).split() == ["@web.authenticated", "@authorized"]
    assert re.search(r"^    _track_activity = False$", source, re.M)
    assert re.search(r'^    auth_resource = "\w+"$', source, re.M)
    assert '"gpuhub", "notices"' in source
    for handler in ("NoticesHandler", "UsageHandler"):  # both ask through the decorated get
        assert f"class {handler}(GuardFileHandler):" in source
        assert not re.search(rf"class {handler}\b(?:(?!\nclass ).)*def get\(", source, re.S)
    assert '"gpuhub", "usage"' in source


# --- the lab extension: the committed build is of the committed sources --------------------------


def package_json() -> dict:
    return json.loads((LABEXTENSION / "package.json").read_text())


def test_the_committed_build_is_of_the_committed_sources():
    """build-stamp.json, written by `make labextension`: the sources' digest then is theirs now,
    and every built file is there as built, and no other."""
    found = stamp.problems()
    assert not found, "\n".join(found)
    assert stamp.output_dir() == LABEXTENSION


def copy_of_the_extension(tmp_path) -> Path:
    """The sources, the image's requirements.txt and the build, laid out as in the repository."""
    singleuser = tmp_path / "singleuser"
    package = singleuser / "labextension"
    package.mkdir(parents=True)
    for path in stamp.source_files():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOURCE / path, package / path)
    shutil.copy(SOURCE / stamp.STAMP, package / stamp.STAMP)
    shutil.copy(SINGLEUSER / stamp.REQUIREMENTS, singleuser / stamp.REQUIREMENTS)
    shutil.copytree(LABEXTENSION, stamp.output_dir(package))
    assert stamp.problems(package) == []
    return package


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def change_the_pin(package: Path) -> None:
    requirements = package.parent / stamp.REQUIREMENTS
    requirements.write_text(
        re.sub(r"^jupyterlab==.*$", "jupyterlab==4.99.0", requirements.read_text(), flags=re.M)
    )


def entry_file(package: Path) -> Path:
    return stamp.output_dir(package) / package_json()["jupyterlab"]["_build"]["load"]


STALE = "the sources changed since the committed build"
CHANGES = {
    "a-source": (lambda package: append(package / "src" / "index.ts", "\n// changed\n"), STALE),
    "a-new-source": (
        lambda package: (package / "src" / "more.ts").write_text("export {};\n"),
        STALE,
    ),
    "the-lockfile": (lambda package: append(package / "package-lock.json", " "), STALE),
    "the-jupyterlab-pin": (change_the_pin, "requirements.txt pins 4.99.0"),
    "a-built-file": (lambda package: append(entry_file(package), ";"), "differs from what"),
    "a-built-file-gone": (lambda package: entry_file(package).unlink(), "is missing"),
    "a-file-added": (
        lambda package: (stamp.output_dir(package) / "static" / "x.js").write_text(""),
        "static/x.js was not built by",
    ),
    "the-stamp-gone": (lambda package: (package / stamp.STAMP).unlink(), "cannot be read"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_since_the_build_is_found_and_the_rebuild_named(tmp_path, change):
    package = copy_of_the_extension(tmp_path)
    make_change, expected = CHANGES[change]
    make_change(package)
    found = stamp.problems(package)
    assert len(found) == 1 and expected in found[0], found
    assert "run `make labextension`" in found[0]


def test_the_build_is_the_source_package_json_with_what_jupyterlab_loads():
    """The builder copies package.json and adds jupyterlab._build: the script the page loads
    (beside it) and the module it asks that script for."""
    built = package_json()
    build = built["jupyterlab"].pop("_build")
    assert built == json.loads((SOURCE / "package.json").read_text())
    assert built["name"] == LABEXTENSION.name == "gpuhub-notices"
    assert (LABEXTENSION / build["load"]).is_file(), f"_build.load names {build['load']}"
    assert re.fullmatch(r"static/remoteEntry\.[0-9a-f]{16,}\.js", build["load"])
    assert build["extension"] == "./extension"


def test_the_extension_is_made_for_the_images_jupyterlab():
    """The image's JupyterLab pin, the extension's @jupyterlab dependencies and the lockfile agree:
    after changing the pin, update package.json (npm install) and run make labextension."""
    pin = stamp.jupyterlab_pin()
    dependencies = json.loads((SOURCE / "package.json").read_text())["dependencies"]
    assert dependencies["@jupyterlab/application"] == f"~{pin}"
    assert dependencies["@jupyterlab/statusbar"] == f"~{pin}"
    lock = json.loads((SOURCE / "package-lock.json").read_text())
    assert lock["name"] == "gpuhub-notices"
    assert lock["packages"]["node_modules/@jupyterlab/application"]["version"] == pin


def test_the_build_has_what_the_browser_tests_select():
    """tests/integration/test_guard.py and check_notices.py find the figures and the whole notice
    by these; the plugin asks these URLs of the server extension."""
    built = "".join(path.read_text() for path in (LABEXTENSION / "static").glob("*.js"))
    selected = [
        "gpuhub-gpu-usage",
        "gpuhub-notices-details",
        "jp-StatusBar-TextItem",
        "gpuhub/notices",
        "gpuhub/usage",
        "apputils:notify",
        "gpuhub-notices:plugin",
    ]
    assert [name for name in selected if name not in built] == []


def test_the_built_scripts_parse_as_javascript():
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node here to parse them (the browser tests run them)")
    for path in (LABEXTENSION / "static").glob("*.js"):
        result = subprocess.run([node, "--check", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, (path.name, result.stderr)


def test_the_image_installs_the_package_and_the_sys_prefix_files():
    dockerfile = (SINGLEUSER / "Dockerfile").read_text()
    assert "COPY images/singleuser/gpuhub_notices /tmp/gpuhub-notices/gpuhub_notices" in dockerfile
    assert "COPY images/singleuser/sys-prefix /tmp/gpuhub-notices/sys-prefix" in dockerfile
    assert 'cp -r /tmp/gpuhub-notices/gpuhub_notices "$site"/' in dockerfile
    assert 'cp -r /tmp/gpuhub-notices/sys-prefix/. "$prefix"/' in dockerfile
    assert "import sys; print(sys.prefix)" in dockerfile
