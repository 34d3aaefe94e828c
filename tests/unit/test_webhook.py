"""GitHub webhook signatures (GitHub's documented test vector) and push payloads."""

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


def test_a_redelivery_is_recognised_and_the_log_stays_bounded():
    log = webhook.DeliveryLog(size=2)
    assert log.first_time("a") and log.first_time("b")
    assert not log.first_time("a")
    assert log.first_time("c")  # "b" is now the oldest and drops out
    assert log.first_time("b")
    assert log.first_time("") and log.first_time("")
