"""Deploying the GPU hub: the organizer's settings (``deploy.settings``, the one reader of the
config file), the deploy steps and ``make status`` (``deploy.status``).

This file imports nothing: the package runs with a bare system python3 before anything is
installed, and on GPU machines that have only the standard library.
"""
