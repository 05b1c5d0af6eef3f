"""Every error glassrt raises derives from GlassrtError and names its culprit.

The rule (DESIGN.md, "Errors"): a bad model or a bad input gets an error that names the
node, op, input and what was expected — never a bare NumPy traceback.
"""
from __future__ import annotations


class GlassrtError(Exception):
    """Base class of all glassrt errors."""


class InvalidArgumentError(GlassrtError, ValueError):
    """An argument of glassrt's API (a session option, a provider list...) is not valid."""


class ModelLoadError(GlassrtError):
    """The model could not be read: missing file, not ONNX, truncated."""


class InvalidModelError(GlassrtError):
    """The model parsed but is malformed (dangling input, cycle, bad initializer...)."""


class UnsafeModelError(InvalidModelError):
    """The model asks for something glassrt refuses to do (read outside its folder...)."""


class UnsupportedOperatorError(GlassrtError):
    """No provider in the priority list can run a node."""


class FallbackError(GlassrtError):
    """fallback="error" and at least one node would fall back to a later provider."""


class ShapeInferenceError(GlassrtError):
    """A node's inputs contradict what its op accepts (found without running it)."""


class InputError(GlassrtError, ValueError):
    """A feed does not match the model's declared inputs."""


class MissingInputError(InputError):
    pass


class UnknownInputError(InputError):
    pass


class InputTypeError(InputError, TypeError):
    pass


class UnknownOutputError(GlassrtError, ValueError):
    """run() asked for an output the model does not have."""


class InputShapeError(InputError):
    pass


class NodeExecutionError(GlassrtError):
    """A kernel failed at run time; the message names node, op and input shapes."""


class KernelContractError(NodeExecutionError):
    """A kernel produced an output that contradicts its op's meta (shape or dtype)."""


class MemoryLimitError(GlassrtError, MemoryError):
    """A plan or a tensor would exceed the session's memory limit."""


def describe_node(node) -> str:
    """'Conv' node 'conv1' (domain '', opset 11) — the phrase every node error starts with."""
    domain = node.domain or "ai.onnx"
    return f"{node.op_type} node '{node.name}' (domain {domain}, opset {node.opset})"


class RunTerminatedError(GlassrtError):
    """A run stopped because its RunOptions.terminate was set."""


class RunTimeoutError(RunTerminatedError, TimeoutError):
    """A run stopped because it took longer than its RunOptions.time_budget_s."""
