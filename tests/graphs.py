"""Hand-built OpGraphs (no torch tracing) for fast, torch-free tests of the builder and planner."""

from autoshard.frontend.graph import OpGraph, OpNode, OpWork, NodeKind as K, TensorMeta as M
def f(*s): return M(tuple(s), "float32", 4)
def linear_work(tokens, k, n):  # what torch's flop counter and saved-tensor hooks report for F.linear
    return OpWork(2 * tokens * k * n, 4 * tokens * k * n, saved_operands=(0, 1))
def mlp_graph(b=8, s=1024, h=1024, f4=4096):
    nodes = [
        OpNode("x", K.INPUT, "x", out=f(b, s, h), qualname="x"),
        OpNode("fc1_weight", K.PARAM, "fc1.weight", out=f(f4, h), module="fc1", qualname="fc1.weight", requires_grad=True),
        OpNode("fc1_bias", K.PARAM, "fc1.bias", out=f(f4), module="fc1", qualname="fc1.bias", requires_grad=True),
        OpNode("linear", K.OP, "linear", "linear", ("x", "fc1_weight", "fc1_bias"), out=f(b, s, f4), module="fc1", requires_grad=True, work=linear_work(b * s, h, f4)),
        OpNode("gelu", K.OP, "gelu", "gelu", ("linear",), out=f(b, s, f4), module="act", requires_grad=True,
               work=OpWork(saved_operands=(0,))),
        OpNode("fc2_weight", K.PARAM, "fc2.weight", out=f(h, f4), module="fc2", qualname="fc2.weight", requires_grad=True),
        OpNode("fc2_bias", K.PARAM, "fc2.bias", out=f(h), module="fc2", qualname="fc2.bias", requires_grad=True),
        OpNode("linear_1", K.OP, "linear", "linear", ("gelu", "fc2_weight", "fc2_bias"), out=f(b, s, h), module="fc2", requires_grad=True, work=linear_work(b * s, f4, h)),
        OpNode("output", K.OUTPUT, "output", inputs=("linear_1",)),
    ]
    return OpGraph({n.name: n for n in nodes}, "manual")
