"""What a participant chooses on the spawn page: an environment (image) and a GPU share.

Pure: the choices offered, and the slices a choice reserves. The form itself is the template
``templates/spawn_options.html``; ``GPUSwarmSpawner`` renders it and applies the choice.
"""

from __future__ import annotations

from dataclasses import dataclass

SLICE, FULL = "slice", "full"
FULL_GPU_FOR = ("admins", "all")


class ChoiceError(ValueError):
    """A spawn-page choice that cannot be honoured; the message is shown to the participant."""


@dataclass(frozen=True)
class Offer:
    """The spawn page's choices for one user."""

    environments: list[str]  # display names of allowed_images, in order
    default_environment: str
    slices: int  # what a normal server reserves
    full_gpu_slices: int  # 0: no full-GPU choice for this user

    @property
    def has_choices(self) -> bool:
        return len(self.environments) > 1 or self.full_gpu_slices > 0


def offer(
    allowed_images: dict[str, str],
    default_image: str,
    slices: int,
    full_gpu_slices: int,
    full_gpu_for: str,
    is_admin: bool,
) -> Offer:
    names = list(allowed_images)
    default = next((n for n, image in allowed_images.items() if image == default_image), "")
    full_allowed = full_gpu_slices > slices and (full_gpu_for == "all" or is_admin)
    return Offer(
        names,
        default or (names[0] if names else ""),
        slices,
        (full_gpu_slices if full_allowed else 0),
    )


def slices_for(choice: dict, offered: Offer) -> int:
    """The slices a server started with ``choice`` (its user_options) reserves."""
    gpu = choice.get("gpu", SLICE)
    if gpu == SLICE:
        return offered.slices
    if gpu == FULL:
        if not offered.full_gpu_slices:
            raise ChoiceError("A full GPU is not offered to you on this hub; choose a GPU slice.")
        return offered.full_gpu_slices
    raise ChoiceError(f"Unknown GPU choice {gpu!r}; choose {SLICE!r} or {FULL!r}.")


def options_from_form(formdata: dict[str, list[str]]) -> dict:
    """The spawn page's form fields as user_options."""
    options = {}
    if formdata.get("image"):
        options["image"] = formdata["image"][0]
    options["gpu"] = (formdata.get("gpu") or [SLICE])[0]
    return options
