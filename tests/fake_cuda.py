"""A CUDA machine as far as device selection sees one, on a CPU: the suite's device code is tested in CI.

:class:`FakeCuda` answers ``torch.cuda.is_available``, ``device_count`` and ``current_device`` like a machine with
``count`` cards, and its ``set_device`` keeps torch's own rule: the index is read by torch's ``_get_device_index``,
which refuses a ``torch.device`` without an index (``ValueError: Expected a torch.device with a specified index``),
as the real ``torch.cuda.set_device`` does. No tensor is made on it; tensors on a fake ``cuda`` device are
:func:`fake_cuda_tensors`' (``FakeTensorMode``).

As a pytest plugin (``-p fake_cuda``, with ``tests/`` on ``PYTHONPATH``) it fakes the machine for the whole run, with
``FAKE_CUDA_COUNT`` cards (default 2) and ``FAKE_CUDA_CURRENT`` current (default 0).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch
from torch.cuda._utils import _get_device_index  # the one torch.cuda.set_device calls


class FakeCuda:
    """``count`` CUDA cards, card ``current`` current; ``selected`` lists the indices ``set_device`` was given."""

    def __init__(self, count: int = 2, current: int = 0, fail: str | None = None):
        self.count, self.current, self.fail = count, current, fail
        self.selected: list[int] = []

    def set_device(self, device) -> None:
        index = _get_device_index(device)  # torch's rule: raises ValueError for torch.device("cuda")
        if self.fail:
            raise RuntimeError(self.fail)
        if not 0 <= index < self.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        self.current = index
        self.selected.append(index)

    def patches(self) -> dict[str, object]:
        return {"is_available": lambda: True, "device_count": lambda: self.count,
                "current_device": lambda: self.current, "set_device": self.set_device}

    def install(self, monkeypatch) -> "FakeCuda":
        for name, value in self.patches().items():
            monkeypatch.setattr(torch.cuda, name, value)
        return self


@contextlib.contextmanager
def fake_cuda_tensors() -> Iterator[object]:
    """``FakeTensorMode`` with a fake CUDA device: inside it, ``torch.zeros(..., device="cuda")`` is a fake tensor on
    ``cuda:0`` (no memory, no kernel), and an operation that meets a CPU tensor with a CUDA one raises
    ``FakeTensorDeviceMismatchError``, as the real kernels would. CPU tensors made before the mode are taken in as
    real CPU inputs (``allow_non_fake_inputs``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


def _install_for_the_run() -> None:
    fake = FakeCuda(int(os.environ.get("FAKE_CUDA_COUNT", "2")), int(os.environ.get("FAKE_CUDA_CURRENT", "0")))
    for name, value in fake.patches().items():
        setattr(torch.cuda, name, value)


if os.environ.get("FAKE_CUDA_PLUGIN") == "1":  # loaded by -p fake_cuda in a run of its own
    _install_for_the_run()
