"""The files in GPUHUB_STATE_DIR that become Docker secrets whose contents change: the HTTPS
gateway's certificate and key, the GitHub OAuth client secret and the tutorial token file.

Docker secrets cannot change in place, so each is named with a hash of its contents (the
``*_VERSION`` values the stack files interpolate): a new file makes a new secret, and the same
file keeps the name, which leaves the services alone.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from pathlib import Path

from worker_setup import engine

from .console import DeployError, Log, run
from .files import read_secret_file
from .settings import Config
from .steps import ensure_state_dir, private_file

#: How long a generated certificate is valid (the most browsers accept: 825 days).
SELF_SIGNED_DAYS = 825
#: What stands in for the certificate and key with GPUHUB_TLS=acme (the gateway gets its own).
ACME_PLACEHOLDER = "# not used with GPUHUB_TLS=acme\n"


def content_version(path: Path) -> str:
    """The first 12 hex digits of the file's SHA-256: the version in its Docker secret's name."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def subject_alt_name(host: str) -> str:
    """``IP:10.0.0.5`` for an address, ``DNS:hub.example.org`` for a name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"


def ensure_tls(config: Config, log: Log) -> dict[str, str]:
    """The gateway's certificate and key in GPUHUB_STATE_DIR/tls: generated (self-signed, once
    per hostname), copied from GPUHUB_TLS_CERT and GPUHUB_TLS_KEY (files), or placeholders
    (acme). Returns the versions of the two secrets."""
    tls = ensure_state_dir(config) / "tls"
    tls.mkdir(mode=0o700, exist_ok=True)
    cert, key, marker = tls / "cert.pem", tls / "key.pem", tls / "self-signed-for"
    host = config.hostname
    if config.tls == "self-signed":
        made_for = marker.read_text().strip() if marker.is_file() else None
        if made_for == host and cert.is_file() and key.is_file():
            log(f"TLS: the self-signed certificate for {host} (kept: {cert})")
        else:
            engine.ensure_packages({"openssl": "openssl"}, log)
            log(f"generating a self-signed certificate for {host} (valid {SELF_SIGNED_DAYS} days)")
            run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes"]
                + ["-days", str(SELF_SIGNED_DAYS), "-subj", f"/CN={host}"]
                + ["-addext", f"subjectAltName={subject_alt_name(host)}"]
                + ["-keyout", str(key), "-out", str(cert)],
                f"openssl could not generate a certificate for {host}",
                "check GPUHUB_HOSTNAME",
            )
            marker.write_text(host + "\n")
    elif config.tls == "files":
        for source, target in ((config.tls_cert, cert), (config.tls_key, key)):
            try:
                private_file(target, Path(source).read_text())
            except OSError as e:
                raise DeployError(f"cannot read {source} ({e.strerror}); check the path") from None
        marker.unlink(missing_ok=True)
        log(f"TLS: certificate {config.tls_cert} and key {config.tls_key}")
    elif config.tls == "acme":
        for target in (cert, key):
            private_file(target, ACME_PLACEHOLDER)
        marker.unlink(missing_ok=True)
        log(f"TLS: acme (the gateway gets the certificate for {host})")
    else:
        raise DeployError(
            f"GPUHUB_TLS is {config.tls!r}; the gateway needs acme, self-signed or files"
        )
    os.chmod(key, 0o600)
    return {
        "GPUHUB_TLS_CERT_VERSION": content_version(cert),
        "GPUHUB_TLS_KEY_VERSION": content_version(key),
    }


def ensure_github_secret(config: Config, log: Log) -> dict[str, str]:
    """The GitHub OAuth client secret as a file for its Docker secret (from the config file, or
    from GPUHUB_GITHUB_CLIENT_SECRET_FILE as the check read it: ``read_secret_file``); never
    printed. Returns the secret's version."""
    path = ensure_state_dir(config) / "github_client_secret"
    if config.github_client_secret_file:
        try:
            secret = read_secret_file(config.github_client_secret_file)
        except OSError as e:
            raise DeployError(
                f"cannot read GPUHUB_GITHUB_CLIENT_SECRET_FILE {config.github_client_secret_file}"
                f" ({e.strerror}); check the path"
            ) from None
        except ValueError as e:  # the check said so before: the file changed since
            raise DeployError(
                f"GPUHUB_GITHUB_CLIENT_SECRET_FILE {config.github_client_secret_file} {e}"
            ) from None
    else:
        secret = config.github_client_secret
    before = content_version(path) if path.is_file() else ""
    private_file(path, secret)
    version = content_version(path)
    log(f"GitHub client secret: {'unchanged' if version == before else 'new version'} {version}")
    return {"GPUHUB_GITHUB_SECRET_VERSION": version}


def ensure_tutorial_token(config: Config, log: Log) -> dict[str, str]:
    """GPUHUB_TUTORIAL_TOKEN_FILE (checked by the settings) copied for the sync service's
    Docker secret, mode 0600; never printed. Returns the secret's version."""
    path = ensure_state_dir(config) / "tutorial_token"
    try:
        text = Path(config.tutorial_token_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DeployError(
            f"cannot read GPUHUB_TUTORIAL_TOKEN_FILE {config.tutorial_token_file} "
            f"({getattr(e, 'strerror', None) or 'not UTF-8'}); check the path"
        ) from None
    before = content_version(path) if path.is_file() else ""
    private_file(path, text)
    version = content_version(path)
    log(f"tutorial token: {'unchanged' if version == before else 'new version'} {version}")
    return {"GPUHUB_TUTORIAL_TOKEN_VERSION": version}
