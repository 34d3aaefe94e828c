"""GPU guard notices in JupyterLab: the Jupyter server extension.

The GPU guard writes its notices to a file inside the participant's container
(``notices.py`` reads it). This extension serves that file's valid notices as JSON at
``<base_url>gpuhub/notices``; the prebuilt lab extension ``gpuhub-notices`` polls it and shows each
new notice as a JupyterLab notification. Enabled by ``jupyter_server_config.d/gpuhub_notices.json``
in the image.

Importing the package needs only the standard library (``gpu-info`` runs ``python3 -m
gpuhub_notices``); Jupyter Server is imported when the server loads the extension.
"""

__version__ = "0.1.0"


def _jupyter_server_extension_points():
    return [{"module": "gpuhub_notices"}]


def _load_jupyter_server_extension(serverapp):
    from .handlers import setup_handlers

    setup_handlers(serverapp)
