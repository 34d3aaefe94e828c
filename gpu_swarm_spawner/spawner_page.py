"""What participants and organizers see of a spawn: the spawn page's form and the choice read
from it, the progress bar, the failure message on the hub's home page, and the dashboard's
records.

Pure functions over plain values, and one small object (``Reporter``) made with what it needs:
GPUSwarmSpawner (spawner.py) calls them from JupyterHub's hooks with explicit arguments, so
nothing here reads the spawner.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jinja2
from jupyterhub.utils import format_exception
from tornado import web

from . import (
    events,
    healing,
    line,
    profiles,
)

if TYPE_CHECKING:
    from .attempt import Attempt
    from .broker import GPUBroker

TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    autoescape=True,
)


def render(template: str, **values) -> str:
    """One of the spawner's HTML templates (templates/), filled in."""
    return TEMPLATES.get_template(template).render(**values)


# ---- the spawn page --------------------------------------------------------------------------


def spawn_form(offered: profiles.Offer) -> str:
    """The spawn page's form for what ``offered`` lets the participant choose; "" when there is
    nothing to choose (the server then starts at once)."""
    if not offered.has_choices:
        return ""
    return render("spawn_options.html", offer=offered)


def read_choice(user_options: dict, offered: profiles.Offer) -> tuple[bool, bool]:
    """(a whole GPU, no GPU): what ``user_options`` asks for, held to ``offered``; a choice not
    offered is HTTP 400 saying what is wrong. The environment (``user_options["image"]``) is
    applied by DockerSpawner.start."""
    try:
        profiles.check_environment(user_options, offered)
        choice = profiles.gpu_choice(user_options, offered)
        profiles.check_line_choice(user_options)
    except profiles.ChoiceError as e:
        raise web.HTTPError(400, str(e)) from None
    return choice == profiles.FULL, choice == profiles.NONE


# ---- the hub's home page after a start ---------------------------------------------------------


def failure_heading(stopped_why: str, active: bool) -> str:
    """The heading of ``failure_message``: the server did not start, or the hub stopped it
    (``stopped_why`` says why)."""
    if stopped_why and not active:
        return "Your server was stopped."
    return "Your server did not start."


def failure_message(
    stopped_why: str, line_lost: float, active: bool, error: BaseException | None
) -> str:
    """What the participant reads on the hub's home page (templates/hub) about their server,
    not ``active``: why the hub stopped it (``stopped_why``: for the disk of its machine,
    ``disk.py``, or idle, the fleet's idle stop); that a hub restart emptied the line they
    waited in since ``line_lost`` (epoch s; 0: it did not); or what the latest start's
    ``error`` told them. "" when none applies."""
    if stopped_why and not active:
        return stopped_why
    if line_lost and not active:
        since = time.strftime("%H:%M", time.localtime(line_lost))
        return (
            f"You were waiting in line for a GPU (since {since}) when the hub restarted, "
            "and the line was emptied. Nothing of yours was lost: start your server again "
            "to take a new place in line."
        )
    if not error:
        return ""
    message, _ = format_exception(error, only_jupyterhub=True)
    return message or f"The server could not start: {error}"


# ---- progress ---------------------------------------------------------------------------------


async def progress(stages: Callable[[], list[dict]]):
    """The stages of a spawn as they are added (``stages()``: the current start's list, read
    anew at each look); JupyterHub stops reading at the end of the spawn."""
    seen = 0
    while True:
        found = stages()
        while seen < len(found):
            yield found[seen]
            seen += 1
        await asyncio.sleep(0.2)


# ---- what the organizer's dashboard reads (events.py) ----------------------------------------


def _line_writer(journal: events.Journal, log):
    """The broker's ``on_line_change``: the line as the dashboard reads it (``line.json``)."""

    def write(entries: list[line.Entry], held_gpu: str, held_for) -> None:
        wall, mono = time.time(), time.monotonic()
        waiting = [
            events.Waiting(
                user=e.owner.user.name,
                server=e.owner.name or "",
                joined=wall - (mono - e.joined),
                slices=e.request.slices,
                holds=held_gpu if e.owner is held_for else "",
            )
            for e in entries
        ]
        try:
            journal.line(waiting, wall)
        except OSError as e:
            log.warning("Could not write the waiting line for the dashboard: %s", e)

    return write


@dataclass(frozen=True)
class Reporter:
    """What one server's spawner tells as it goes: the stages of its current start for the
    progress bar (kept by that start, ``attempt``: ``Attempt.progress``), and the events of the
    organizer's dashboard, kept in ``dashboard_dir`` ("": none kept). Made by the spawner with
    what it knows (``GPUSwarmSpawner.reporter``)."""

    log: logging.Logger
    log_name: str
    user: str
    server: str
    dashboard_dir: str
    broker: GPUBroker
    attempt: Attempt

    def report(self, percent: int, message: str) -> None:
        """A stage of the start for the progress bar (and the log); a repeat of the last is
        dropped (``Attempt.report``)."""
        if self.attempt.report(percent, message):
            self.log.debug("Spawn progress of %s: %s%% %s", self.log_name, percent, message)

    def journal(self) -> events.Journal | None:
        """The hub's journal in ``dashboard_dir`` (None: none is kept). The broker's line is
        written there too from the first call on."""
        if not self.dashboard_dir:
            return None
        journal = events.journal_for(self.dashboard_dir)
        if self.broker.on_line_change is None:
            self.broker.on_line_change = _line_writer(journal, self.log)
        return journal

    def record(self, kind: str, **fields) -> None:
        """An event for the dashboard; a failed write is logged, never raised."""
        journal = self.journal()
        if journal is None:
            return
        event = events.Event(time.time(), kind, self.user, self.server, **fields)
        try:
            journal.record(event)
        except OSError as e:
            self.log.warning("Could not record '%s' of %s: %s", kind, self.log_name, e)

    def healed(self, action: str, message: str) -> None:
        """Something the hub put right about this server (``healing.py``)."""
        healing.record(self.log, self.journal(), action, message, self.user, self.server)
