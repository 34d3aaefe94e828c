"""What participants and organizers see of a spawn: the spawn page's offer, the progress bar,
the failure message, and the dashboard's records. Part of GPUSwarmSpawner (spawner.py).
"""

from __future__ import annotations

import asyncio
import os
import time

import jinja2
from jupyterhub.utils import format_exception
from tornado import web
from traitlets import HasTraits, default

from . import (
    events,
    line,
    profiles,
)

TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    autoescape=True,
)


def render(template: str, **values) -> str:
    """One of the spawner's HTML templates (templates/), filled in."""
    return TEMPLATES.get_template(template).render(**values)


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


class SpawnPage(HasTraits):
    """GPUSwarmSpawner's page, progress and records."""

    # ---- the spawn page ----------------------------------------------------------------------

    def spawn_offer(self) -> profiles.Offer:
        """What this user may choose: the environments of ``allowed_images``, a full GPU, no
        GPU."""
        images = self.allowed_images_now()
        return profiles.offer(
            images if isinstance(images, dict) else {},
            self.image,
            self.slices_per_server,
            self.full_gpu_for,
            is_admin=bool(getattr(self.user, "admin", False)),
            cpu_only=self.cpu_only_servers,
        )

    @default("options_form")
    def _spawn_page_form(self):
        def form(spawner):
            offered = spawner.spawn_offer()
            if not offered.has_choices:
                return ""  # nothing to choose: the server starts at once
            return render("spawn_options.html", offer=offered)

        return form

    @default("options_from_form")
    def _spawn_page_form_reader(self):
        return profiles.options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        def apply(spawner, user_options):
            # the environment (user_options["image"]) is applied by DockerSpawner.start
            try:
                offered = spawner.spawn_offer()
                profiles.check_environment(user_options, offered)
                choice = profiles.gpu_choice(user_options, offered)
                spawner.full_gpu_requested = choice == profiles.FULL
                spawner.cpu_only_requested = choice == profiles.NONE
                profiles.check_line_choice(user_options)
            except profiles.ChoiceError as e:
                raise web.HTTPError(400, str(e)) from None
            spawner.forget_one_off_choices()

        return apply

    # ---- progress ---------------------------------------------------------------------------

    def _report(self, progress: int, message: str) -> None:
        """Record a stage of the spawn for the progress bar (and the log): this start's
        (``attempt.Attempt.progress``)."""
        if self.attempt.report(progress, message):
            self.log.debug("Spawn progress of %s: %s%% %s", self.log_name, progress, message)

    async def progress(self):
        """The stages of this spawn, as they happen (JupyterHub stops reading at the end)."""
        seen = 0
        while True:
            events = self.attempt.progress
            while seen < len(events):
                yield events[seen]
                seen += 1
            await asyncio.sleep(0.2)

    @property
    def failure_heading(self) -> str:
        """The heading of ``failure_message`` on the hub's home page: the server did not start,
        or it was stopped (for its machine's disk)."""
        if self.disk_stopped and not self.active:
            return "Your server was stopped."
        return "Your server did not start."

    @property
    def failure_message(self) -> str:
        """What the participant was told when this server's latest start failed; "" when it
        did not fail (or a new start began), or why the hub stopped it for the disk of its
        machine (``disk.py``) until the next start. The hub's home page shows it
        (templates/hub)."""
        if self.disk_stopped and not self.active:
            return self.disk_stopped
        if self.line_lost and not self.active:
            since = time.strftime("%H:%M", time.localtime(self.line_lost))
            return (
                f"You were waiting in line for a GPU (since {since}) when the hub restarted, "
                "and the line was emptied. Nothing of yours was lost: start your server again "
                "to take a new place in line."
            )
        error = self.last_start_error
        if not error:
            return ""
        message, _ = format_exception(error, only_jupyterhub=True)
        return message or f"The server could not start: {error}"

    def stopped_for_disk(self, reason: str, machine: str) -> None:
        """The hub is stopping this server for the disk of ``machine`` (``disk.py``): its
        participant reads ``reason`` on their page until their next start, and the dashboard
        lists the stop."""
        self.disk_stopped = reason
        self._record(events.DISK_STOP, node=machine, reason=reason)

    # ---- what the organizer's dashboard reads (events.py) ------------------------------------

    def _journal(self) -> events.Journal | None:
        """This hub's journal in ``dashboard_dir`` (None: none is kept). The broker's line is
        written there too from the first call on."""
        if not self.dashboard_dir:
            return None
        journal = events.journal_for(self.dashboard_dir)
        if self.broker.on_line_change is None:
            self.broker.on_line_change = _line_writer(journal, self.log)
        return journal

    def _record(self, kind: str, **fields) -> None:
        """An event for the dashboard; a failed write is logged, never raised."""
        journal = self._journal()
        if journal is None:
            return
        event = events.Event(time.time(), kind, self.user.name, self.name or "", **fields)
        try:
            journal.record(event)
        except OSError as e:
            self.log.warning("Could not record '%s' of %s: %s", kind, self.log_name, e)

    def forget_one_off_choices(self) -> None:
        """JupyterHub keeps a start's options for the next start without options ("Start My
        Server"). Waiting in line and starting without a GPU answer the moment (the GPUs were
        full): the next start asks for a GPU again, and is offered both again if it must."""
        saved = dict(self.saved_user_options())
        kept = profiles.without_one_off_choices(saved)
        if kept != saved:
            self.write_row_now(user_options=kept)

    def _save_state(self) -> None:
        """Write this spawner's state to the hub's database now (JupyterHub itself writes it
        only once a start or stop has finished)."""
        self.write_row_now(state=self.get_state())
