"""glassrt — an ONNX inference runtime that shows every decision it makes."""
from .errors import (FallbackError, GlassrtError, InputError, InputShapeError, InputTypeError,  # noqa: F401
                     InvalidArgumentError,
                     InvalidModelError, KernelContractError, MemoryLimitError, MissingInputError,
                     ModelLoadError, NodeExecutionError, RunTerminatedError, RunTimeoutError, ShapeInferenceError,
                     UnknownInputError, UnknownOutputError,
                     UnsafeModelError, UnsupportedOperatorError)
from .ir import TensorType as TensorMeta  # noqa: F401
from .kernels.custom import CustomOp, custom_op  # noqa: F401
from .runtime.options import RunOptions, SessionOptions  # noqa: F401
from .io_binding import IOBinding  # noqa: F401
from .api import FallbackWarning, InferenceSession, NodeArg  # noqa: F401
from . import contrib  # noqa: F401

__version__ = "0.1.0"
