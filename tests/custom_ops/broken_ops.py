"""Deliberately broken custom ops: `glassrt check --module` must name each defect."""
import numpy as np

import glassrt

F = [np.float32, np.float64]


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# 1. A meta whose shape is wrong (drops the last dim).
wrong_meta = glassrt.custom_op("broken::wrong_meta(Tensor x) -> Tensor", dtypes=F)
wrong_meta.register_meta(lambda x: glassrt.TensorMeta(x.dtype, x.shape[:-1]))
wrong_meta.register_kernel("cpu", lambda x: x * 2)

# 2. A meta that hard-codes batch 1 (works for batch 1, breaks dynamic batch).
batch_one = glassrt.custom_op("broken::batch_one(Tensor x) -> Tensor", dtypes=F)
batch_one.register_meta(lambda x: glassrt.TensorMeta(x.dtype, (2,) + tuple(x.shape[1:])))
batch_one.register_kernel("cpu", lambda x: x + 1)

# 3. A declared dtype the kernel cannot run.
bad_dtype = glassrt.custom_op("broken::bad_dtype(Tensor x) -> Tensor", dtypes=[np.float32, np.int64])


@bad_dtype.register_kernel("cpu")
def _bad_dtype(x):
    if x.dtype.kind != "f":
        raise TypeError(f"only floats, got {x.dtype}")
    return np.sqrt(np.abs(x))


bad_dtype.register_meta(lambda x: x)

# 4. A fused kernel a little off from its decomposition (swish with a slightly wrong constant).
off_fused = glassrt.custom_op("broken::off_fused(Tensor x, float beta=1.0) -> Tensor", dtypes=F)
off_fused.register_meta(lambda x, beta: x)
off_fused.register_kernel("cpu", lambda x, beta: x * _sigmoid(beta * x) * 1.001)
off_fused.register_decomposition(lambda g, x, beta: g.Mul(x, g.Sigmoid(g.Mul(x, g.CastLike(g.constant(beta), x)))))

# 5. A wrong backward (forgets the chain rule's inner derivative).
wrong_grad = glassrt.custom_op("broken::wrong_grad(Tensor x) -> Tensor", dtypes=F)
wrong_grad.register_meta(lambda x: x)
wrong_grad.register_kernel("cpu", lambda x: np.sin(2 * x))
wrong_grad.register_backward(lambda ctx, gy: [gy * np.cos(2 * ctx.inputs[0])])

# 6. Declared differentiable, no backward.
no_grad = glassrt.custom_op("broken::no_grad(Tensor x) -> Tensor", dtypes=F, differentiable=True)
no_grad.register_meta(lambda x: x)
no_grad.register_kernel("cpu", lambda x: np.tanh(x))
