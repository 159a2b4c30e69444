"""VAE-2/3/5/6: the reference's own state-dict ABI check (reference.place.slots), case by case.

test_vae.py judges every loader on whole VAEs; these tests call `state_slots` and
`is_torch_code` directly with small modules, to pin how the reference tells torch's code from
user code (partials, bound methods, objects without a module), what its messages say (where,
which class, which hook, the component) and what it records per slot.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

from reference.errors import StateDictABIError
from reference.place.slots import is_torch_code, state_slots

pytestmark = pytest.mark.reference_only("calls reference.place.slots directly and pins its wording")


def user_function(*args: Any, **kwargs: Any) -> None:
    """Code that is not torch's."""


class CallableHook:
    """A user hook object: callable, with neither a __qualname__ nor a __module__ of torch."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        pass


@pytest.mark.rule("VAE-3")
@pytest.mark.parametrize(
    ("obj", "torchs"),
    [
        (torch.is_tensor, True),  # __module__ is exactly "torch"
        (nn.Module.state_dict, True),
        (functools.partial(nn.Module.state_dict), True),
        (nn.Linear(1, 1).state_dict, True),  # a bound method of a torch object
        (functools.partial(functools.partial(torch.is_tensor)), True),
        (functools.partial(user_function), False),
        (user_function, False),
        (object(), False),  # no __module__ of its own: its type's ("builtins") decides
        (CallableHook(), False),
    ],
    ids=[
        "torch",
        "torch-nn",
        "partial",
        "bound-method",
        "nested-partial",
        "user-partial",
        "user",
        "object",
        "hook-object",
    ],
)
def test_is_torch_code(obj: object, torchs: bool) -> None:
    assert is_torch_code(obj) is torchs


def vae_like() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(2, 2, 1), nn.GroupNorm(1, 2))


@pytest.mark.rule("VAE-3")
def test_a_user_function_patched_onto_a_torch_class_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nn.GroupNorm, "_load_from_state_dict", user_function)
    with pytest.raises(StateDictABIError, match=r"submodule '1' \(GroupNorm\) overrides"):
        state_slots(vae_like(), component="vae")


@pytest.mark.rule("VAE-3")
@pytest.mark.parametrize(("path", "where"), [("", "the root module"), ("0", "submodule '0'")])
def test_an_instance_replacement_names_where(path: str, where: str) -> None:
    module = vae_like()
    setattr(module.get_submodule(path), "state_dict", user_function)  # noqa: B010
    with pytest.raises(StateDictABIError) as caught:
        state_slots(module, component="video_vae")
    assert str(caught.value) == (
        f"video_vae: {where} replaces state_dict on the instance; direct streaming needs torch's"
        " own state-dict functions. Remove the assignment or load video_vae without direct"
        " loading"
    )


class UserConv(nn.Conv2d):
    def _save_to_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._save_to_state_dict(*args, **kwargs)


@pytest.mark.rule("VAE-3")
def test_an_override_names_the_class_and_its_owner() -> None:
    module = nn.Sequential(UserConv(2, 2, 1))
    with pytest.raises(StateDictABIError) as caught:
        state_slots(module, component="vae")
    assert str(caught.value) == (
        f"vae: submodule '0' (UserConv) overrides _save_to_state_dict in {__name__}."
        "UserConv; direct streaming writes slots directly and would skip that code. Remove the"
        " override or load vae without direct loading"
    )


@pytest.mark.rule("VAE-3")
@pytest.mark.parametrize("hook", [user_function, CallableHook()], ids=["function", "object"])
def test_a_user_hook_is_named(hook: Any) -> None:
    module = vae_like()
    module[1].register_state_dict_pre_hook(hook)  # type: ignore[no-untyped-call]
    name = "user_function" if hook is user_function else repr(hook)
    with pytest.raises(StateDictABIError) as caught:
        state_slots(module, component="vae")
    assert str(caught.value) == (
        f"vae: submodule '1' has a user state_dict pre-hook ({name}); direct streaming writes"
        " slots directly and would skip it. Remove the hook or load vae without direct loading"
    )


class Tied(nn.Module):
    def __init__(self, *, shared: int) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)
        self.b.weight = self.a.weight
        if shared:
            self.c = self.a
        if shared > 1:
            self.d = self.b


@pytest.mark.rule("VAE-6")
@pytest.mark.parametrize(
    ("shared", "groups"),
    [
        (0, "a.weight = b.weight"),
        (
            1,
            "a.weight = b.weight = c.weight; a.bias = c.bias (submodule registered under several"
            " paths: a and c)",
        ),
        (
            2,
            "a.weight = b.weight = c.weight = d.weight; a.bias = c.bias; b.bias = d.bias"
            " (submodule registered under several paths: a and c, b and d)",
        ),
    ],
    ids=["tied", "tied-and-shared", "two-shared"],
)
def test_tied_state_is_listed(shared: int, groups: str) -> None:
    with pytest.raises(StateDictABIError) as caught:
        state_slots(Tied(shared=shared), component="vae")
    assert str(caught.value) == (
        f"vae: tied state, one tensor under several names: {groups}. Direct streaming fills each"
        " slot from its own checkpoint tensor; untie them or load vae without direct loading"
    )


class FancyParameter(nn.Parameter):
    pass


@pytest.mark.rule("VAE-4")
def test_a_parameter_subclass_is_refused_by_class_name() -> None:
    module = nn.Linear(2, 2)
    module.weight = FancyParameter(torch.ones(2, 2))
    with pytest.raises(StateDictABIError) as caught:
        state_slots(module, component="vae")
    assert str(caught.value) == (
        "vae: weight is a FancyParameter, not a plain nn.Parameter; its class is settled by code"
        " that direct streaming does not run. Use plain parameters or load vae without direct"
        " loading"
    )


class ExtraState(nn.Linear):
    """Standard state-dict functions, but `get_extra_state` adds a key that is no slot."""

    def get_extra_state(self) -> int:
        return 1

    def set_extra_state(self, state: Any) -> None:
        pass


@pytest.mark.rule("VAE-5")
def test_keys_that_are_not_slots_are_listed() -> None:
    with pytest.raises(StateDictABIError) as caught:
        state_slots(nn.Sequential(ExtraState(2, 2)), component="vae")
    assert str(caught.value) == (
        "vae: state-dict keys differ from the slots (parameters and persistent buffers): keys"
        " that are not slots: ['0._extra_state']; slots missing from the state dict: none."
        " Direct streaming can only fill slots; load vae without direct loading"
    )


@pytest.mark.rule("VAE-4", "VAE-10")
def test_slots_record_what_was_built() -> None:
    module = nn.Linear(2, 3)
    module.bias.requires_grad_(False)
    module.register_buffer("scale", torch.ones(3, requires_grad=True))
    module.register_buffer("cache", torch.ones(1), persistent=False)
    slots = state_slots(module, component="vae")
    assert list(slots) == ["weight", "bias", "scale"]
    got = {k: (s.is_parameter, s.shape, s.dtype, s.requires_grad, s.attr) for k, s in slots.items()}
    assert got == {
        "weight": (True, (3, 2), torch.float32, True, "weight"),
        "bias": (True, (3,), torch.float32, False, "bias"),
        "scale": (False, (3,), torch.float32, False, "scale"),
    }
    assert all(s.owner is module for s in slots.values())
