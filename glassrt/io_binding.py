"""IOBinding, as onnxruntime's: inputs bound once and reused by every run, outputs written
into arrays the caller owns (no new array per run), for loops that run a session many
times on buffers they keep.

glassrt runs on the CPU, so "device" arguments must say cpu (device 0), synchronize_* have
nothing to wait for, and raw pointers (onnxruntime's buffer_ptr) are refused: glassrt cannot
check what lies behind an address; bind the NumPy array itself.
"""
from __future__ import annotations

import numpy as np

from . import dtypes
from .errors import InvalidArgumentError, UnknownInputError, UnknownOutputError


def _cpu(device_type, device_id):
    if str(device_type).lower() != "cpu" or int(device_id) != 0:
        raise InvalidArgumentError(f"device {device_type!r}:{device_id}: glassrt runs on the CPU (device 'cpu', 0)")


class IOBinding:
    def __init__(self, session):
        self.session = session
        self._inputs: dict = {}
        self._outputs: dict = {}  # name -> caller's array, or None (glassrt allocates)
        self._results: list = []

    # ---------------------------------------------------------------- inputs

    def bind_cpu_input(self, name: str, value) -> None:
        if name not in {i.name for i in self.session.get_inputs()} | set(self.session.graph.overridable()):
            raise UnknownInputError(f"bind_cpu_input: no input {name!r}; the model's inputs are "
                                    f"{[i.name for i in self.session.get_inputs()]}")
        self._inputs[name] = value  # checked at each run, as a feed

    def bind_input(self, name: str, value=None, *pointer_form, **kw) -> None:
        """bind_input(name, array). onnxruntime's pointer form (device, element type, shape,
        buffer_ptr) is refused."""
        if pointer_form or kw or not isinstance(value, (np.ndarray, list, tuple, int, float, bool, np.generic)):
            raise InvalidArgumentError(f"bind_input({name!r}, ...): glassrt binds arrays, not raw buffers "
                                       f"(device, element type, shape, pointer); use bind_cpu_input(name, array)")
        self.bind_cpu_input(name, value)

    def bind_ortvalue_input(self, name: str, value) -> None:
        self.bind_input(name, value)

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def inputs(self) -> dict:
        return dict(self._inputs)

    # ---------------------------------------------------------------- outputs

    def bind_output(self, name: str, device_type="cpu", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None, *, array: np.ndarray | None = None) -> None:
        """Bind an output: with `array`, each run writes that output into it (it must have
        the output's dtype and shape, checked per run); without, the run's result is kept
        for get_outputs / copy_outputs_to_cpu."""
        outputs = self.session.graph.output_names()
        if name not in outputs:
            raise UnknownOutputError(f"bind_output: no output {name!r}; the model's outputs are {outputs}")
        _cpu(device_type, device_id)
        if buffer_ptr is not None:
            raise InvalidArgumentError(f"bind_output({name!r}, buffer_ptr=...): glassrt does not write through raw "
                                       f"pointers; pass the NumPy array: bind_output({name!r}, array=arr)")
        if array is not None:
            if not isinstance(array, np.ndarray) or not array.flags.writeable:
                raise InvalidArgumentError(f"bind_output({name!r}, array=...): a writeable NumPy array is needed")
            if element_type is not None and np.dtype(element_type) != array.dtype:
                raise InvalidArgumentError(f"bind_output({name!r}): element_type {np.dtype(element_type)} disagrees "
                                           f"with the array's {dtypes.name(array.dtype)}")
            if shape is not None and tuple(shape) != array.shape:
                raise InvalidArgumentError(f"bind_output({name!r}): shape {list(shape)} disagrees with the array's "
                                           f"{list(array.shape)}")
        self._outputs[name] = array

    def bind_ortvalue_output(self, name: str, value) -> None:
        self.bind_output(name, array=value)

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []

    def output_names(self) -> list:
        return list(self._outputs)

    def bound_arrays(self) -> dict:
        return {n: a for n, a in self._outputs.items() if a is not None}

    def set_outputs(self, names, values) -> None:
        self._results = list(values)

    def get_outputs(self) -> list:
        """The last run's outputs (the bound arrays themselves where an array was bound)."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list:
        """Copies of the last run's outputs."""
        return [np.array(v, copy=True) if isinstance(v, np.ndarray) else v for v in self._results]

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: glassrt runs on the CPU, synchronously."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: glassrt runs on the CPU, synchronously."""
