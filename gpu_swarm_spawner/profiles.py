"""What a participant chooses on the spawn page: an environment (image) and a GPU share.

Pure: the choices offered, and whether a choice takes a whole GPU. The form itself is the template
``templates/spawn_options.html``; ``GPUSwarmSpawner`` renders it and applies the choice.
"""

from __future__ import annotations

from dataclasses import dataclass

SLICE, FULL, NONE = "slice", "full", "none"  # a GPU share, a whole GPU, no GPU (CPU only)
JOIN = "join"  # the line choice: wait in line when no GPU has room
#: Who may choose a full GPU: nobody, admins or everyone.
FULL_GPU_FOR = ("off", "admins", "all")


class ChoiceError(ValueError):
    """A spawn-page choice that cannot be honoured; the message is shown to the participant."""


@dataclass(frozen=True)
class Offer:
    """The spawn page's choices for one user."""

    environments: list[str]  # display names of allowed_images, in order
    default_environment: str
    slices_per_server: int  # what a server on a GPU share reserves
    full_gpu: bool  # this user may ask for a whole GPU (all of its slices)
    cpu_only: bool = False  # this user may start a server without a GPU

    @property
    def has_choices(self) -> bool:
        """A form is worth showing. The CPU-only choice alone is not worth a click before every
        start: it is offered where it matters, on the refusal and in the waiting line."""
        return len(self.environments) > 1 or self.full_gpu


def offer(
    allowed_images: dict[str, str],
    default_image: str,
    slices_per_server: int,
    full_gpu_for: str,
    is_admin: bool,
    cpu_only: bool = False,
) -> Offer:
    names = list(allowed_images)
    default = next((n for n, image in allowed_images.items() if image == default_image), "")
    full_gpu = full_gpu_for == "all" or (full_gpu_for == "admins" and is_admin)
    first = default or (names[0] if names else "")
    return Offer(names, first, slices_per_server, full_gpu, cpu_only)


def gpu_choice(choice: dict, offered: Offer) -> str:
    """What a server started with ``choice`` (its user_options) asks for: ``SLICE``, ``FULL``
    (a whole GPU) or ``NONE`` (no GPU); a choice not offered is a ``ChoiceError``."""
    gpu = choice.get("gpu", SLICE)
    if gpu == SLICE:
        return SLICE
    if gpu == FULL:
        if not offered.full_gpu:
            raise ChoiceError("A full GPU is not offered to you on this hub; choose a GPU slice.")
        return FULL
    if gpu == NONE:
        if not offered.cpu_only:
            raise ChoiceError(
                "Servers without a GPU are not offered on this hub; choose a GPU slice."
            )
        return NONE
    raise ChoiceError(f"Unknown GPU choice {gpu!r}; choose {SLICE!r}, {FULL!r} or {NONE!r}.")


def check_environment(choice: dict, offered: Offer) -> None:
    """The environment ``choice`` asks for (``image``, a name of allowed_images) is one this
    hub offers: asked before any GPU is reserved or any place in line taken, where
    DockerSpawner's own check comes only in its start, after both (a participant on a full hub
    was told "all slices in use", or waited in line, and was then refused the image)."""
    name = choice.get("image")
    if name and name not in offered.environments:
        listed = ", ".join(offered.environments)
        fix = f"choose one of: {listed}" if listed else "leave it out: this hub has one image"
        raise ChoiceError(f"There is no environment {name!r} on this hub; {fix}.")


def wants_full_gpu(choice: dict, offered: Offer) -> bool:
    """Whether a server started with ``choice`` (its user_options) takes a whole GPU."""
    return gpu_choice(choice, offered) == FULL


def options_from_form(formdata: dict[str, list[str]]) -> dict:
    """The spawn page's form fields as user_options."""
    options = {}
    if formdata.get("image"):
        options["image"] = formdata["image"][0]
    options["gpu"] = (formdata.get("gpu") or [SLICE])[0]
    if formdata.get("line"):
        options["line"] = formdata["line"][0]  # "join": wait in line when the GPUs are full
    return options


def without_one_off_choices(choice: dict) -> dict:
    """``choice`` as a later start should reuse it: without waiting in line or going without a
    GPU, which answer the moment (the GPUs were full), not the participant's preference."""
    kept = {k: v for k, v in choice.items() if k != "line"}
    if kept.get("gpu") == NONE:
        del kept["gpu"]
    return kept


def check_line_choice(choice: dict) -> None:
    """The only line choice is ``join`` (wait in line when no GPU has room)."""
    if choice.get("line", JOIN) != JOIN:
        raise ChoiceError(f"Unknown line choice {choice['line']!r}; the only one is {JOIN!r}.")
