"""GitHub webhook signatures (GitHub's documented test vector), push payloads, the size cap."""

import json
import re
from pathlib import Path
from urllib.parse import quote_plus

import pytest

from tutorial_sync import webhook

# From GitHub's "Validating webhook deliveries" documentation.
SECRET = "It's a Secret to Everybody"
BODY = b"Hello, World!"
EXPECTED = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_githubs_test_vector():
    assert webhook.signature(SECRET, BODY) == EXPECTED
    assert webhook.signature_is_valid(SECRET, BODY, EXPECTED)


def test_bad_missing_and_malformed_signatures_are_refused():
    assert not webhook.signature_is_valid(SECRET, BODY + b" ", EXPECTED)
    assert not webhook.signature_is_valid("another secret", BODY, EXPECTED)
    assert not webhook.signature_is_valid(SECRET, BODY, None)
    assert not webhook.signature_is_valid(SECRET, BODY, "")
    assert not webhook.signature_is_valid(SECRET, BODY, EXPECTED.replace("sha256=", "sha1="))
    assert not webhook.signature_is_valid("", BODY, webhook.signature("", BODY)), "no secret set"


def test_push_names_branch_and_repository():
    payload = {
        "ref": "refs/heads/main",
        "repository": {
            "full_name": "Workshop/Tutorials",
            "clone_url": "https://github.com/Workshop/Tutorials.git",
            "ssh_url": "git@github.com:Workshop/Tutorials.git",
        },
    }
    assert webhook.pushed_branch(payload) == "main"
    assert webhook.pushed_branch({"ref": "refs/tags/v1"}) == ""
    names = webhook.repository_names(payload)
    assert {"workshop/tutorials", "github.com/workshop/tutorials"} <= names
    assert webhook.normalise_url("git@github.com:Workshop/Tutorials.git") == (
        "github.com/Workshop/Tutorials"
    )


def test_a_delivery_counts_as_seen_once_handled_and_the_log_stays_bounded():
    log = webhook.DeliveryLog(size=2)
    assert not log.seen("a"), "asked about, not handled (refused or failed): not seen"
    assert not log.seen("a")
    log.handled("a")
    log.handled("b")
    assert log.seen("a")  # and "a" is now the most recently seen
    log.handled("c")  # "b" is now the oldest and drops out
    assert log.seen("a") and log.seen("c") and not log.seen("b")
    log.handled("")
    assert not log.seen(""), "a delivery without an id is never a duplicate"


PUSH = {"ref": "refs/heads/main", "repository": {"full_name": "Org/Tutorials"}}


def test_a_push_is_read_from_its_body():
    push = webhook.parse_push(json.dumps(PUSH).encode())
    assert push == webhook.Push("main", frozenset({"org/tutorials"}))
    tag = webhook.parse_push(json.dumps({**PUSH, "ref": "refs/tags/v1"}).encode())
    assert tag.branch == ""


@pytest.mark.parametrize(
    "body, says",
    [
        (b"[]", "the body is a JSON array, not an object"),
        (b'"push"', "a JSON string, not an object"),
        (b"null", "a JSON null, not an object"),
        (b"42", "a JSON number"),
        (b"{}", "`ref` is missing"),
        (json.dumps({"ref": "refs/heads/main"}).encode(), "`repository` is missing"),
        (json.dumps({**PUSH, "repository": "Org/Tutorials"}).encode(), "not an object"),
        (json.dumps({**PUSH, "repository": ["Org/Tutorials"]}).encode(), "not an object"),
        (json.dumps({**PUSH, "ref": 5}).encode(), "`ref` is missing or not a string"),
        (json.dumps({**PUSH, "repository": {}}).encode(), "no `full_name` or URL"),
        (json.dumps({**PUSH, "repository": {"full_name": 5, "url": None}}).encode(), "no `full"),
        (b"payload=%7B%22ref%22", "not JSON; set the webhook's content type to application/json"),
        (b"", "not JSON"),
        (b'{"ref": "refs/heads/m\xff"}', "not UTF-8"),
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_a_body_of_an_unexpected_shape_is_malformed_with_the_reason(body, says):
    with pytest.raises(webhook.Malformed, match=re.escape(says)):
        webhook.parse_push(body)


def test_names_that_are_not_strings_are_ignored():
    payload = {"repository": {"full_name": ["x"], "clone_url": "https://github.com/O/R.git"}}
    assert webhook.repository_names(payload) == {"github.com/o/r"}
    assert webhook.repository_names({"repository": "O/R"}) == set()
    assert webhook.pushed_branch({"ref": ["refs/heads/main"]}) == ""


@pytest.mark.parametrize(
    "content_length, refused",
    [
        (None, False),  # chunked: counted while read
        ("0", False),
        (str(webhook.MAX_PAYLOAD), False),
        (str(webhook.MAX_PAYLOAD + 1), True),
        ("99999999999999999999", True),
        ("12, 12", False),  # unreadable: the HTTP server refuses it itself
    ],
)
def test_bodies_above_githubs_cap_are_too_large(content_length, refused):
    assert webhook.too_large(content_length) is refused
    assert webhook.MAX_PAYLOAD == 25 * 1024 * 1024


# ---- GitHub's recorded deliveries (tests/fixtures/github/webhook_*.json) -------------------------

FIXTURES = Path(__file__).parent.parent / "fixtures" / "github"


def recorded(name: str) -> tuple[bytes, str]:
    """A recorded delivery's body as GitHub sends it, and its Content-Type."""
    f = json.loads((FIXTURES / f"{name}.json").read_text())
    content_type, text = f["headers"]["Content-Type"], json.dumps(f["payload"])
    if webhook.is_form(content_type):
        text = "payload=" + quote_plus(text)
    return text.encode(), content_type


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/gpu-school/intro.git",
        "https://github.com/gpu-school/intro",
        "https://github.com/GPU-School/Intro/",
        "git@github.com:gpu-school/intro.git",
        "https://x-access-token:ghp_0123456789@github.com/gpu-school/intro.git",
    ],
)
def test_githubs_push_names_the_repository_as_organizers_write_it(url):
    push = webhook.parse_push(recorded("webhook_push")[0])
    assert push.branch == "main"
    assert webhook.normalise_url(url).lower() in push.names


def test_a_form_encoded_ping_is_read_and_refused_with_the_fix():
    body, content_type = recorded("webhook_ping_form")
    assert body.startswith(b"payload=%7B%22zen%22")
    ping = webhook.parse_ping(body, content_type)
    assert ping.content_type == "form" and "gpu-school/intro" in ping.names
    urls = ["https://github.com/gpu-school/intro.git"]
    assert webhook.ping_problems(ping, content_type, urls) == [webhook.USE_JSON]
    # the hook's setting alone says so too (a proxy may have changed the header)
    assert webhook.ping_problems(ping, "application/json", urls) == [webhook.USE_JSON]
    json_ping = webhook.parse_ping(*recorded("webhook_ping_json"))
    assert webhook.ping_problems(json_ping, "application/json", urls) == []


def test_an_organizations_ping_is_ok_when_a_tutorial_is_in_it():
    body, content_type = recorded("webhook_ping_organization")
    ping = webhook.parse_ping(body, content_type)
    assert ping.organization == "gpu-school" and not ping.names
    assert webhook.ping_problems(ping, content_type, ["https://github.com/GPU-School/x.git"]) == []
    [problem] = webhook.ping_problems(ping, content_type, ["https://github.com/other/x.git"])
    assert problem.startswith("no tutorial repository is in the organization gpu-school")


@pytest.mark.parametrize(
    "body, content_type, says",
    [
        (b"{}", "application/json", "`hook` is missing"),
        (b"payload", "application/x-www-form-urlencoded", "without a `payload` field"),
        (b"zen=1", "application/x-www-form-urlencoded", "without a `payload` field"),
        (b"[", "application/json", "not JSON"),
    ],
)
def test_a_ping_of_an_unexpected_shape_is_malformed(body, content_type, says):
    with pytest.raises(webhook.Malformed, match=re.escape(says)):
        webhook.parse_ping(body, content_type)


def test_credentials_are_taken_out_of_urls_in_errors():
    text = "fatal: unable to access 'https://x-access-token:ghp_abc@github.com/o/r.git/': 403"
    assert webhook.without_credentials(text) == (
        "fatal: unable to access 'https://github.com/o/r.git/': 403"
    )
    assert webhook.without_credentials("ssh://git@host/x and git@github.com:o/r") == (
        "ssh://host/x and git@github.com:o/r"
    )
