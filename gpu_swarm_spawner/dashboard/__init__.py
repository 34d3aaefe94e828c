"""The organizer's live dashboard, a JupyterHub service (``app.py``; the page it shows is built
by ``model.py`` from the swarm, the GPU guards and the hub's journal)."""
