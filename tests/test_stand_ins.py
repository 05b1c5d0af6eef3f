"""Placement's judging of static_only kernels on symbolic shapes (runtime/select.py): a
kernel's shape-free refusal (`applies`) is final, and the stand-in bindings of a node's
symbolic dims are made once per node, shared by its kernels."""
from __future__ import annotations

import numpy as np

from glassrt import symbolic
from glassrt.ir import Node, TensorType
from glassrt.kernels.registry import BindContext, Kernel
from glassrt.runtime import select

F32 = np.dtype(np.float32)


class _Provider:
    name, partial = "probe", True

    def __init__(self, kernels):
        self.ks = kernels

    def kernels(self, domain, op_type, opset):
        return self.ks


def _symbolic_relu():
    node = Node("Relu", "", ["x"], ["y"], {}, "relu", 14)
    t = TensorType(F32, (symbolic.symbol("batch"), 8))
    return BindContext(node, {}, [t], [t], [None])


def _kernel(name, asked, applies=None, accepts_all=False):
    def accepts(ctx):
        asked.append((name, ctx.shape(0)))
        return None if accepts_all else "refuses every shape"
    return Kernel(name=f"probe.Relu.{name}", provider="probe", domain="", op_type="Relu", fn=None,
                  accepts=accepts, applies=applies, static_only=True)


def test_a_shape_free_refusal_is_not_judged_again_on_stand_ins():
    asked = []
    k = _kernel("never", asked, applies=lambda ctx: "not its case, whatever the shapes")
    ks, why, accepted, shape_free = select.provider_verdict_checked(_Provider([k]), _symbolic_relu().node, None,
                                                                    _symbolic_relu(), frozenset({"batch"}))
    assert ks == [] and why == "not its case, whatever the shapes" and not shape_free
    assert asked == []  # its shape predicate never ran: no stand-in was judged


def test_stand_ins_are_made_once_per_node(monkeypatch):
    made, asked = [], []
    real = select.stand_in
    monkeypatch.setattr(select, "stand_in", lambda ctx, value=32, ones=(): made.append((value, ones)) or
                        real(ctx, value, ones))
    ks = [_kernel("a", asked), _kernel("b", asked), _kernel("c", asked, accepts_all=True)]
    ctx = _symbolic_relu()
    got, why, accepted, _ = select.provider_verdict_checked(_Provider(ks), ctx.node, None, ctx, frozenset({"batch"}))
    assert [k.name for k in got] == ["probe.Relu.c"] and not accepted
    # a and b refuse all three bindings (batch at 1, at 32, at 1024), c takes the first:
    # seven judgements on three stand-in contexts
    assert asked == [("a", (1, 8)), ("a", (32, 8)), ("a", (1024, 8)), ("b", (1, 8)), ("b", (32, 8)),
                     ("b", (1024, 8)), ("c", (1, 8))]
    assert made == [(32, frozenset({"batch"})), (32, ()), (1024, ())]


def _ranked_kernel(name, asked, priority, accepts):
    def judge(ctx):
        asked.append((name, ctx.shape(0)))
        return accepts(ctx)
    return Kernel(name=f"probe.Relu.{name}", provider="probe", domain="", op_type="Relu", fn=None,
                  accepts=judge, static_only=True, priority=priority)


def _static_relu(batch):
    node = Node("Relu", "", ["x"], ["y"], {}, "relu", 14)
    t = TensorType(F32, (batch, 8))
    return BindContext(node, {}, [t], [t], [None])


def test_a_kernel_behind_one_that_passed_is_judged_only_by_a_plan_it_may_run():
    """Placement judges a node's kernels best first, and stops judging shapes once one
    passes: the others stay candidates, judged by a plan whose shapes the better one refuses
    (some predicates build what they judge: QLinearConv's float32 kernel behind VNNI's)."""
    from glassrt import SessionOptions
    from glassrt.runtime.placement import Decision

    asked = []
    ks = [_ranked_kernel("worse", asked, 0, lambda ctx: None),  # (registered first, ranked lower)
          _ranked_kernel("better", asked, 5, lambda ctx: None if ctx.shape(0)[0] == 1 else "only one row")]
    for ctx, accepted in ((_static_relu(1), True), (_symbolic_relu(), False)):
        asked.clear()
        got, why, was_accepted, _ = select.provider_verdict_checked(_Provider(ks), ctx.node, None, ctx,
                                                                    frozenset({"batch"}))
        assert [k.name for k in got] == ["probe.Relu.better", "probe.Relu.worse"] and was_accepted == accepted
        assert asked == [("better", (1, 8))]  # (the symbolic one on its batch-1 stand-in)

    decision = Decision(_static_relu(1).node, "probe", got, why)
    asked.clear()
    k, _ = select.choose_kernel(decision, _static_relu(1), SessionOptions())
    assert k.name == "probe.Relu.better" and asked == [("better", (1, 8))]
    asked.clear()
    k, reason = select.choose_kernel(decision, _static_relu(4), SessionOptions())
    assert k.name == "probe.Relu.worse" and asked == [("better", (4, 8)), ("worse", (4, 8))]
    assert "only one row" in reason
