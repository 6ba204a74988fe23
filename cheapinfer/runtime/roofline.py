"""What a decode step streams, and how fast against the device's copy bandwidth: the roofline the claims read.

A decode step reads every weight it uses once (a bandwidth-bound step: its time is these bytes over the bus's
speed) and the caches of its requests. :func:`streamed_bytes` counts the weights in the form they are stored
(codes and scales of a low-bit format included), :func:`decode_efficiency` sets the bytes per second a step
reached against a copy timed in the same rounds.
"""

from __future__ import annotations

import torch


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor stores, looking inside tensor subclasses (torchao) and bitsandbytes' quantization state."""
    if hasattr(t, "__tensor_flatten__"):  # a wrapper subclass: its inner tensors hold the bytes
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    total = t.numel() * t.element_size()
    state = getattr(t, "quant_state", None)  # bitsandbytes Params4bit: absmax (and its own nested state)
    if state is not None:
        for part in (getattr(state, "absmax", None), getattr(getattr(state, "state2", None), "absmax", None), getattr(state, "offset", None)):
            if isinstance(part, torch.Tensor):
                total += part.numel() * part.element_size()
    scb = getattr(t, "SCB", None)  # bitsandbytes Int8Params: one scale per row
    if isinstance(scb, torch.Tensor):
        total += scb.numel() * scb.element_size()
    return total


def streamed_bytes(model) -> int:
    """Bytes one decode step reads in full: every matrix product's weight as stored, norms, biases, and one embedding row."""
    emb = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and getattr(head, "weight", None) is not None and head.weight.data_ptr() == emb.weight.data_ptr()
    seen, total = set(), 0
    for module in model.modules():
        tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        for name, t in tensors:
            if t is None or id(t) in seen or name in ("inv_freq", "original_inv_freq"):
                continue
            seen.add(id(t))
            if module is emb and not tied:
                total += tensor_bytes(t) // emb.num_embeddings  # a lookup reads one row
            else:
                total += tensor_bytes(t)
    return total


def decode_efficiency(step_bytes: int, step_seconds: float, copy_bytes_per_second: float) -> float:
    """Bytes a decode step streams per second over the device's measured copy bandwidth (1.0: the step runs at the bus's speed)."""
    return step_bytes / step_seconds / copy_bytes_per_second
