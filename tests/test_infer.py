"""infer_device_types over every accepted input (FakeTensor devices are SIMULATED)."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import pytest
import torch
from tests._fakes import fake_tensor
from tests._internals import collect_devices

from devrng import infer_device_types

fake = fake_tensor


@pytest.mark.parametrize(("obj", "expected"), [
    (0, ()),
    ("cpu", ()),
    ("meta", ()),
    ("xpu:1", ("xpu",)),
    ("xla:0", ("xla",)),
    ("cuda", ("cuda",)),
    (torch.device("mps"), ("mps",)),
    (torch.ones(1), ()),
    (torch.ones(1, device="meta"), ()),
    (torch.Generator(), ()),
    ([], ()),
    ({}, ()),
])
def test_single_objects(obj: object, expected: tuple[str, ...]) -> None:
    assert infer_device_types(obj) == expected


def test_first_seen_order_without_duplicates() -> None:
    obj = ["xla:0", ("cuda:1", {"k": "xpu"}), {"xla:1", "xla:2"}, "cuda:0"]
    assert infer_device_types(obj) == ("xla", "cuda", "xpu")


def test_fake_tensors_report_their_simulated_device() -> None:
    assert infer_device_types([fake("cuda:1"), fake("xpu:0"), fake("mps:0")]) == ("cuda", "xpu", "mps")


def test_modules_report_parameters_and_buffers() -> None:
    model = torch.nn.Linear(2, 2, device="meta")
    model.weight = torch.nn.Parameter(fake("xpu:0"))
    model.register_buffer("steps", fake("cuda:0"))
    assert infer_device_types(model) == ("xpu", "cuda")
    assert infer_device_types(torch.nn.Linear(2, 2)) == ()


def test_parameters_and_subclasses_and_namedtuples() -> None:
    Pair = namedtuple("Pair", "a b")
    p = torch.nn.Parameter(fake("cuda:0"))
    obj = OrderedDict(x=Pair(p, frozenset({"xla:3"})))
    assert infer_device_types(obj) == ("cuda", "xla")


def test_indices_are_collected_per_type() -> None:
    found = collect_devices(["xla:1", "xla:0", "xla:1", 3, "cuda", torch.device("cuda", 2)])
    assert found.indices == {"xla": [1, 0], "cuda": [None, 2]}
    assert found.ints == [3]


def test_deep_nesting() -> None:
    obj: object = "xpu:0"
    for _ in range(200):
        obj = [obj]
    assert infer_device_types(obj) == ("xpu",)


def test_walks_every_leaf_of_a_large_tree() -> None:
    leaves = [torch.zeros(1) for _ in range(10_000)] + [fake("cuda:0")]
    assert infer_device_types({"a": leaves[:5000], "b": (leaves[5000:],)}) == ("cuda",)


@pytest.mark.parametrize("bad", [1.5, None, b"cuda", object(), True])
def test_unsupported_objects_raise_type_error_naming_the_type(bad: object) -> None:
    with pytest.raises(TypeError, match=rf"object of type builtins\.{type(bad).__name__} "):
        infer_device_types(["cuda:0", {"k": bad}])


def test_bad_device_string_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"'gpu:0' is not a device string; use a device type"):
        infer_device_types(["gpu:0"])
