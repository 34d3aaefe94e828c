"""The exceptions a start ends with: what the participant reads, and a lost slice race."""

from __future__ import annotations

from jupyterhub.spawner import SpawnException


class SpawnFailed(SpawnException):
    """A start that failed for a reason the participant should read, on whichever page they are.

    JupyterHub shows ``jupyterhub_message`` on the error page (a failure within the spawn's
    first second), the spawn-pending page (later), the spawn form and the REST API's JSON body;
    any other exception raised in the first second becomes "500 : Unhandled error starting
    server". The log gets ``log_message``, with the details an organizer needs.
    """

    def __init__(self, message: str, log_message: str = "", *, reason="error", status_code=500):
        super().__init__(message, reason=reason, log_message=log_message, status_code=status_code)
        self.jupyterhub_message = message


class NoGPUSliceAvailable(SpawnFailed):
    """No GPU has room for the request: HTTP 503, with what the participant can do about it;
    ``offer``: HTML offering what they may do instead (wait in line), shown after the message
    on the pages that show HTML (JupyterHub's ``jupyterhub_html_message``)."""

    def __init__(self, message: str, log_message: str, offer: str = ""):
        super().__init__(message, log_message, reason="capacity", status_code=503)
        if offer:
            self.jupyterhub_html_message = offer


class SliceTaken(RuntimeError):
    """Swarm could not place the service: another server took the slice first."""
