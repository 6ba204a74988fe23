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


def _on_fake_cuda(x) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor) and x.device.type == "cuda"


def _written_out(t: torch.Tensor, index) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """``t[index]`` as the operators Python indexing stands for, as torch's own indexing applies them: integers
    ``select``, slices ``slice``, ``None`` ``unsqueeze``, ``...`` skips; the view that leaves, and the tensor
    indices at the view's dimensions (``aten.index``'s list; all ``None``: no tensor index). A CPU build of torch
    cannot run ``Tensor.__getitem__`` on a fake CUDA tensor (it asks for a CUDA device guard), but runs these."""
    index = index if isinstance(index, tuple) else (index,)
    used = sum(1 for i in index if i is not None and i is not Ellipsis)
    out, dim, tensors = t, 0, []
    for i in index:
        if i is Ellipsis:
            dim += t.dim() - used
        elif i is None:
            out, dim = out.unsqueeze(dim), dim + 1
        elif isinstance(i, int):
            out = out.select(dim, i)
        elif isinstance(i, slice):
            out, dim = torch.ops.aten.slice.Tensor(out, dim, i.start, i.stop, i.step or 1), dim + 1
        elif isinstance(i, (torch.Tensor, list)):
            idx = i if isinstance(i, torch.Tensor) else torch.tensor(i)
            if idx.dtype == torch.bool:
                raise NotImplementedError("fake_cuda: a mask index has a data-dependent shape")
            if idx.device != t.device and idx.device.type != "cpu":  # the real kernels' rule
                raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor ({t.device})")
            tensors += [None] * (dim - len(tensors)) + [idx]
            dim += 1
        else:
            raise NotImplementedError(f"fake_cuda: index {i!r}")
    return out, tensors


def _basic_index(t: torch.Tensor, index) -> torch.Tensor:
    """``t[index]``, written out (:func:`_written_out`)."""
    out, tensors = _written_out(t, index)
    return torch.ops.aten.index.Tensor(out, tensors) if tensors else out


def _basic_assign(t: torch.Tensor, index, value) -> None:
    """``t[index] = value``, written out (:func:`_written_out`)."""
    out, tensors = _written_out(t, index)
    value = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=t.dtype)
    if tensors:
        torch.ops.aten.index_put_.default(out, tensors, value)
    else:
        out.copy_(value)


@contextlib.contextmanager
def fake_cuda_tensors() -> Iterator[object]:
    """``FakeTensorMode`` with a fake CUDA device: inside it, ``torch.zeros(..., device="cuda")`` is a fake tensor on
    ``cuda:0`` (no memory, no kernel), and an operation that meets a CPU tensor with a CUDA one raises
    ``FakeTensorDeviceMismatchError``, as the real kernels would. CPU tensors made before the mode are taken in as
    real CPU inputs (``allow_non_fake_inputs``).

    Indexing (``t[i]``, ``t[i] = v``) that involves a fake CUDA tensor, and ``Tensor.to`` a CUDA device, are run as
    the operators they stand for (:func:`_basic_index`, ``aten._to_copy``), which a CPU build of torch can run on
    one; a CPU tensor indexed by a CUDA one raises, as on a GPU. What fake tensors cannot follow: a value read
    back to Python (``.item()``, ``float(t)``, ``bool(t)``, a mask index), which has no fake value."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    getitem, setitem, to = torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to

    def involved(t, index) -> bool:
        return _on_fake_cuda(t) or any(_on_fake_cuda(i) for i in (index if isinstance(index, tuple) else (index,)))

    def fake_getitem(t, index):
        return _basic_index(t, index) if involved(t, index) else getitem(t, index)

    def fake_setitem(t, index, value):
        if not (involved(t, index) or _on_fake_cuda(value)):
            return setitem(t, index, value)
        _basic_assign(t, index, value)

    def fake_to(t, *args, **kwargs):
        device, dtype = torch._C._nn._parse_to(*args, **kwargs)[:2]
        if device is None or device.type != "cuda":
            return to(t, *args, **kwargs)
        device = torch.device("cuda", device.index or 0)
        if t.device == device and dtype in (None, t.dtype):
            return t
        return torch.ops.aten._to_copy.default(t, dtype=dtype or t.dtype, device=device)

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to = fake_getitem, fake_setitem, fake_to
        try:
            yield mode
        finally:
            torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.to = getitem, setitem, to


def _install_for_the_run() -> None:
    fake = FakeCuda(int(os.environ.get("FAKE_CUDA_COUNT", "2")), int(os.environ.get("FAKE_CUDA_CURRENT", "0")))
    for name, value in fake.patches().items():
        setattr(torch.cuda, name, value)


if os.environ.get("FAKE_CUDA_PLUGIN") == "1":  # loaded by -p fake_cuda in a run of its own
    _install_for_the_run()
