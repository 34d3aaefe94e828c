"""The spawn page: which environments and GPU shares a user is offered, whether a choice takes
a whole GPU; the rendered form."""

from types import SimpleNamespace

import pytest
from jupyterhub.objects import Hub
from tornado.web import HTTPError

from gpu_swarm_spawner import GPUSwarmSpawner
from gpu_swarm_spawner.profiles import (
    ChoiceError,
    gpu_choice,
    offer,
    options_from_form,
    wants_full_gpu,
)

IMAGES = {"PyTorch": "reg/pytorch:1", "TensorFlow": "reg/tensorflow:1"}


def test_admins_are_offered_a_full_gpu_and_participants_a_slice():
    admin = offer(IMAGES, "reg/tensorflow:1", 1, "admins", is_admin=True)
    assert admin.environments == ["PyTorch", "TensorFlow"]
    assert admin.default_environment == "TensorFlow"
    assert wants_full_gpu({"gpu": "full"}, admin) is True
    assert wants_full_gpu({}, admin) is wants_full_gpu({"gpu": "slice"}, admin) is False

    participant = offer(IMAGES, "reg/pytorch:1", 1, "admins", is_admin=False)
    assert participant.full_gpu is False
    with pytest.raises(ChoiceError, match="not offered to you"):
        wants_full_gpu({"gpu": "full"}, participant)
    assert offer(IMAGES, "x", 1, "all", is_admin=False).full_gpu is True
    assert offer(IMAGES, "x", 1, "off", is_admin=True).full_gpu is False


def test_no_choices_without_environments_or_a_full_gpu():
    assert not offer({}, "img", 1, "off", is_admin=True).has_choices
    assert not offer({"Only": "img"}, "img", 1, "admins", is_admin=False).has_choices
    assert offer({}, "img", 1, "all", is_admin=False).has_choices


def test_a_made_up_choice_is_refused_with_what_to_choose():
    with pytest.raises(ChoiceError, match="choose 'slice', 'full' or 'none'"):
        wants_full_gpu({"gpu": "two"}, offer({}, "img", 1, "all", is_admin=True))


def test_no_gpu_is_a_choice_only_where_offered_and_alone_makes_no_form():
    offered = offer({}, "img", 1, "off", is_admin=False, cpu_only=True)
    assert gpu_choice({"gpu": "none"}, offered) == "none"
    assert not offered.has_choices  # offered on the refusal and in the line, not before start
    with pytest.raises(ChoiceError, match="Servers without a GPU are not offered"):
        gpu_choice({"gpu": "none"}, offer({}, "img", 1, "off", is_admin=False))
    assert gpu_choice({}, offered) == "slice"


def test_form_fields_become_user_options():
    assert options_from_form({"image": ["PyTorch"], "gpu": ["full"]}) == {
        "image": "PyTorch",
        "gpu": "full",
    }
    assert options_from_form({}) == {"gpu": "slice"}


def spawner(admin, **config):
    user = SimpleNamespace(name="ada", id=1, url="/user/ada/", admin=admin)
    return GPUSwarmSpawner(user=user, hub=Hub(), **config)


def test_the_spawn_page_form_lists_the_environments_and_the_full_gpu_for_admins():
    config = dict(allowed_images=IMAGES, image="reg/pytorch:1", full_gpu_for="admins")
    html = spawner(True, **config).options_form(spawner(True, **config))
    assert '<option value="PyTorch" selected>PyTorch</option>' in html
    assert '<option value="TensorFlow" >TensorFlow</option>' in html
    assert 'value="full"' in html and "A full GPU (all of its slices" in html
    participant = spawner(False, **config)
    assert 'value="full"' not in participant.options_form(participant)
    plain = spawner(False)
    assert plain.options_form(plain) == ""  # nothing to choose: no form at all


async def test_a_choice_is_applied_and_a_refused_one_is_a_400_with_the_message():
    admin = spawner(True, full_gpu_for="admins")
    await admin._run_apply_user_options({"gpu": "full"})
    assert admin.gpu_request().slices is None  # a whole GPU, its slices counted at placement
    await admin._run_apply_user_options({})
    assert admin.gpu_request().slices == 1

    participant = spawner(False, full_gpu_for="admins")
    with pytest.raises(HTTPError) as refused:
        await participant._run_apply_user_options({"gpu": "full"})
    assert refused.value.status_code == 400
    assert "not offered to you" in refused.value.log_message


async def test_an_environment_not_offered_is_a_400_before_anything_is_reserved():
    participant = spawner(False, allowed_images=IMAGES, image="reg/pytorch:1")
    with pytest.raises(HTTPError) as refused:
        await participant._run_apply_user_options({"image": "Julia"})
    assert refused.value.status_code == 400
    assert refused.value.log_message == (
        "There is no environment 'Julia' on this hub; choose one of: PyTorch, TensorFlow."
    )
    await participant._run_apply_user_options({"image": "TensorFlow"})  # offered: taken
    plain = spawner(False)
    with pytest.raises(HTTPError, match="leave it out: this hub has one image"):
        await plain._run_apply_user_options({"image": "PyTorch"})


def test_the_deprecated_full_gpu_slices_still_offers_admins_a_full_gpu():
    assert spawner(True, full_gpu_slices=3).full_gpu_for == "admins"
    assert spawner(True).full_gpu_for == "off"  # a hub that sets nothing offers none
