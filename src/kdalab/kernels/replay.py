"""Replaying a call's launches: the entry points' default (``KernelConfig.launch``,
``kda_decode(launch=)``; docs/kernels.md "Host overhead").

A short call is bound by the host: validation, the sequence tables, the launch plan, the
wrappers' arguments, the launch key and the launcher's pointer checks take longer than the
kernels (0.08 ms of GPU work at T = 1024, H = 16). All of it but the buffers and the
addresses is the same from one call to the next with the same key: the shapes, strides,
dtypes, devices and 16-byte alignment of the tensor arguments, which of them are the same
tensor, the options, and the ``cu_seqlens`` tensor (its identity and version, as the
sequence tables' cache). So the first call of a key runs the ordinary path (direct launches)
under a :class:`Recorder`: it notes each buffer the call allocates (:func:`new_buffer`) and
each launch (the compiled kernel, the grid, every parameter's value). A launch's tensor is
then an input (by address), a buffer of the call (by storage, with its offset: views of one
allocation) or a sequence table (a constant the record keeps alive); a tensor descriptor (the
checkpoints' store) names a whole buffer and its layout. A later call of the key allocates
the same buffers (zeroing the rows a buffer had zeroed: the checkpoints past the last),
builds each descriptor again on its new buffer and hands each compiled kernel's launcher
the new addresses, and nothing else runs. A call the record cannot describe — a tensor that
is none of those, a descriptor on anything but a whole buffer, a launch outside the direct
path (launch hooks, the interpreter), an output that is not a buffer of the call — is never
replayed (its key remembers that), and nothing is replayed while Triton's launch hooks are
set (a profiler).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from . import launch as _launch

_TENSOR = torch.Tensor
#: records kept per entry point (the least recently used dropped)
CACHE_SIZE = 64
_NO = object()  # a key whose call cannot be replayed


def new_buffer(shape, *, dtype, device, zero_from=None) -> torch.Tensor:
    """``torch.empty``, noted by the call being recorded on this thread (if any); with
    ``zero_from``, its rows from that one on are zeroed (on each replay too)."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if zero_from is not None and zero_from < shape[0]:
        t[zero_from:].zero_()
    else:
        zero_from = None
    rec = getattr(_launch.RECORDING, "recorder", None)
    if rec is not None:
        rec.buffers.append(t)
        rec.zeroed.append(zero_from)
    return t


def buffer_like(x: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like`` (contiguous), noted as :func:`new_buffer`."""
    return new_buffer(x.shape, dtype=x.dtype, device=x.device)


class Recorder:
    """What one call allocated and launched (``launch.launch`` reports each launch)."""

    def __init__(self):
        self.buffers: list[torch.Tensor] = []
        self.zeroed: list[int | None] = []  # each buffer's first zeroed row (None: none)
        self.launches: list[tuple] = []  # (compiled kernel, grid of 3, values)
        self.refused = False

    def launched(self, kernel, grid, values) -> None:
        if kernel is None:
            self.refused = True
        else:
            self.launches.append((kernel, tuple(grid) + (1,) * (3 - len(grid)), list(values)))

    def __enter__(self):
        _launch.RECORDING.recorder = self
        return self

    def __exit__(self, *exc):
        _launch.RECORDING.recorder = None
        return False


class _Unreplayable(Exception):
    pass


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Record:
    """A recorded call: the buffers to allocate, each launch with its tensors as slots, and
    which buffers the call returns."""

    def __init__(self, rec: Recorder, inputs, constants, outputs):
        self.buffers = [(tuple(b.shape), b.dtype, b.device) for b in rec.buffers]
        # (buffer, its first zeroed row) for the buffers the call zeroed rows of
        self.zero_rows = tuple((i, z) for i, z in enumerate(rec.zeroed) if z is not None)
        by_address = {}
        for j, x in enumerate(inputs):
            if x is not None:
                by_address.setdefault(x.data_ptr(), j)
        by_storage = {_storage(b): (i, b.data_ptr()) for i, b in enumerate(rec.buffers)}
        self.constants = [c for c in constants if c is not None]  # kept alive
        fixed = {_storage(c) for c in self.constants}
        self.launches = []
        for kernel, grid, values in rec.launches:
            slots, descriptors = [], []
            for pos, v in enumerate(values):
                if isinstance(v, TensorDescriptor):
                    # rebuilt on the new buffer each run: its base must be a whole buffer
                    i, base = by_storage.get(_storage(v.base), (None, None))
                    if (i is None or v.base.data_ptr() != base
                            or v.base.dtype != rec.buffers[i].dtype):
                        raise _Unreplayable("a tensor descriptor on no buffer of the call")
                    # every field but the base, as this Triton's TensorDescriptor has them
                    descriptors.append((pos, i, {f.name: getattr(v, f.name)
                                                 for f in dataclasses.fields(v)
                                                 if f.name != "base"}))
                    values[pos] = None
                    continue
                if not isinstance(v, torch.Tensor):
                    continue
                if v.__class__ is not _TENSOR:
                    raise _Unreplayable(f"a tensor of class {type(v).__name__}")
                s = _storage(v)
                if s in by_storage:
                    i, base = by_storage[s]
                    slots.append((pos, 0, i, v.data_ptr() - base))
                elif v.data_ptr() in by_address:
                    slots.append((pos, 1, by_address[v.data_ptr()], 0))
                elif s in fixed:
                    values[pos] = v.data_ptr()
                    continue
                else:
                    raise _Unreplayable("a tensor that is neither an input, a buffer of the "
                                        "call nor a sequence table")
                values[pos] = None
            self.launches.append((kernel, grid, tuple(values), tuple(slots),
                                  tuple(descriptors)))
        ids = {id(b): i for i, b in enumerate(rec.buffers)}
        self.outputs = []
        for o in outputs:
            if o is not None and id(o) not in ids:
                raise _Unreplayable("an output that is not a buffer of the call")
            self.outputs.append(None if o is None else ids[id(o)])

    def run(self, addresses, device_index: int) -> tuple:
        """The recorded launches on new buffers and the inputs at ``addresses`` (a call of the
        same key: None where it has None, as the record's call had); returns the output
        buffers (None where the call returned None)."""
        bufs = [torch.empty(shape, dtype=dtype, device=dev)
                for shape, dtype, dev in self.buffers]
        for i, zero_from in self.zero_rows:
            bufs[i][zero_from:].zero_()
        bases = ([b.data_ptr() for b in bufs], addresses)
        stream = _launch._driver()[1](device_index)
        for kernel, (g0, g1, g2), template, slots, descriptors in self.launches:
            values = list(template)
            for pos, kind, idx, off in slots:
                values[pos] = bases[kind][idx] + off
            for pos, idx, layout in descriptors:
                values[pos] = TensorDescriptor(bufs[idx], **layout)
            kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None,
                       None, None, *values)
        return tuple(None if i is None else bufs[i] for i in self.outputs)


def addresses(tensors) -> list:
    """Each tensor's address, None where absent."""
    return [None if x is None else x.data_ptr() for x in tensors]


def tensors_key(tensors, ptrs=None) -> tuple:
    """What the tensor arguments contribute to a key: each one's shape, strides, dtype,
    device and 16-byte alignment (Triton specializes on it), None where absent, and which
    of them are the same tensor (a launch slot names its input by address). ``ptrs``: their
    :func:`addresses`, when the caller has them."""
    if ptrs is None:
        ptrs = addresses(tensors)
    return (tuple([None if x is None else (x.shape, x.stride(), x.dtype, x.device, not p & 15)
                   for x, p in zip(tensors, ptrs)]),
            tuple([ptrs.index(p) for p in ptrs]))


def hooks_set() -> bool:
    """Whether Triton's launch hooks are set (a profiler): then nothing is replayed."""
    runtime = _launch._driver()[2]
    return _launch._hooked(runtime.launch_enter_hook) or _launch._hooked(
        runtime.launch_exit_hook)


class Replayer:
    """One entry point's records by key; the least recently used dropped past
    ``CACHE_SIZE``."""

    def __init__(self):
        self.records: OrderedDict = OrderedDict()

    def __call__(self, options, inputs, call, constants, outputs_of, rebuild):
        """``call()`` (the ordinary path through direct launches) the first time a key is
        seen, recorded; later, the record run on ``inputs`` and ``rebuild(outputs)``. The
        key: the device, :func:`tensors_key` of ``inputs`` (tensors or None) and the hashable
        ``options``; an argument that cannot be keyed takes ``call()``, whose checks say
        what is wrong. ``constants()``: the tensors the call may read that outlive it
        (sequence tables); ``outputs_of(result)``: the result's tensors, in ``rebuild``'s
        order."""
        try:
            device_index = _launch.current_device()
            ptrs = addresses(inputs)
            key = (device_index, tensors_key(inputs, ptrs), options)
            rec = self.records.get(key)  # hashes the key
        except (TypeError, AttributeError, RuntimeError):  # not a tensor, unhashable, no GPU
            return call()
        if rec is not None and rec is not _NO and not hooks_set():
            try:
                self.records.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile: the record still runs
                pass
            return rebuild(rec.run(ptrs, device_index))
        if rec is not None or getattr(_launch.RECORDING, "recorder", None) is not None:
            return call()
        with Recorder() as r:
            result = call()
        try:
            if r.refused or not r.launches:
                raise _Unreplayable("a launch outside the direct path")
            self.records[key] = Record(r, inputs, constants(), outputs_of(result))
        except Exception:  # noqa: BLE001 - whatever the record cannot describe: not replayed
            self.records[key] = _NO
        if len(self.records) > CACHE_SIZE:
            self.records.popitem(last=False)
        return result
