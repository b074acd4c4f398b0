"""torch.ops.kdalab.chunk_kda_fwd and .kda_decode: the same bits as the Python entry points,
the pool mutated in place, fake implementations that torch.compile(fullgraph=True) traces,
and (GPU) CUDA-graph capture of a decode step replayed with new inputs. On the CPU the ops run
the Triton interpreter and compile with the ``aot_eager`` backend (fake tensors, functional
graph, no C++ compile); the GPU test compiles with inductor."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import kdalab.kernels  # noqa: E402,F401 - registers torch.ops.kdalab
from kdalab.kernels import chunk_kda_fwd, kda_decode  # noqa: E402
from tests.serving_inputs import INTERP, inputs, pool  # noqa: E402

interp = pytest.mark.skipif(not INTERP, reason="runs in the TRITON_INTERPRET=1 child process")
gpu = pytest.mark.gpu


class TinyKDA(torch.nn.Module):
    """A KDA layer's shape: one projection to q, k, v, g, β, then prefill or decode through
    the pool (GVA: HV = 2 H)."""

    def __init__(self, D=32, H=1, HV=2, K=16, V=16):
        super().__init__()
        self.dims = (H, HV, K, V)
        self.proj = torch.nn.Linear(D, 2 * H * K + HV * V + HV * K + HV)
        self.out = torch.nn.Linear(HV * V, D)
        self.A_log = torch.nn.Parameter(torch.linspace(-0.5, 0.5, HV))
        self.dt_bias = torch.nn.Parameter(torch.zeros(HV * K))

    def forward(self, x, state_pool, state_indices, prefill: bool):
        H, HV, K, V = self.dims
        n, t, _ = x.shape
        q, k, v, g, b = torch.split(self.proj(x), [H * K, H * K, HV * V, HV * K, HV], -1)
        q, k = q.reshape(n, t, H, K), k.reshape(n, t, H, K)
        v, g = v.reshape(n, t, HV, V), g.reshape(n, t, HV, K)
        if prefill:
            o, _, ck = torch.ops.kdalab.chunk_kda_fwd(
                q, k, v, g, b, self.A_log, self.dt_bias, state_pool=state_pool,
                state_indices=state_indices, lower_bound=-1.0, checkpoint_every=16)
            return self.out(o.reshape(n, t, HV * V)), ck
        o = torch.ops.kdalab.kda_decode(q, k, v, g, b, state_pool, state_indices, self.A_log,
                                        self.dt_bias, lower_bound=-1.0)
        return self.out(o.reshape(n, t, HV * V)), None


@interp
def test_interp_ops_equal_the_entry_points():
    q, k, v, g, beta, kw = inputs(2, 20, 1, 2, 16, 16)
    p1, p2 = pool(4, 2, 16, 16), pool(4, 2, 16, 16)
    idx = torch.tensor([2, 0])
    o1, f1, c1 = torch.ops.kdalab.chunk_kda_fwd(q, k, v, g, beta, kw["A_log"], kw["dt_bias"],
                                                state_pool=p1, state_indices=idx,
                                                lower_bound=-1.0, checkpoint_every=16)
    o2, f2, c2 = chunk_kda_fwd(q, k, v, g, beta, state_pool=p2, state_indices=idx,
                               checkpoint_every=16, **kw)
    assert f1.numel() == 0 and f2 is None
    assert torch.equal(o1, o2) and torch.equal(c1, c2) and torch.equal(p1, p2)
    d1 = torch.ops.kdalab.kda_decode(q[:, :2], k[:, :2], v[:, :2], g[:, :2], beta[:, :2], p1,
                                     idx, kw["A_log"], kw["dt_bias"], lower_bound=-1.0)
    d2 = kda_decode(q[:, :2], k[:, :2], v[:, :2], g[:, :2], beta[:, :2], state_pool=p2,
                    state_indices=idx, **kw)
    assert torch.equal(d1, d2) and torch.equal(p1, p2)


@interp
def test_interp_fake_implementations_pass_opcheck():
    q, k, v, g, beta, kw = inputs(2, 4, 1, 2, 16, 16)
    idx = torch.tensor([1, 0])
    torch.library.opcheck(torch.ops.kdalab.kda_decode.default,
                          (q, k, v, g, beta, pool(2, 2, 16, 16), idx),
                          dict(lower_bound=-1.0), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.kdalab.chunk_kda_fwd.default, (q, k, v, g, beta),
                          dict(initial_state=pool(2, 2, 16, 16), output_final_state=True,
                               checkpoint_every=16, lower_bound=-1.0),
                          test_utils=("test_schema", "test_faketensor"))


@interp
def test_interp_compile_fullgraph_small_layer():
    torch.manual_seed(0)
    layer = TinyKDA()
    x = torch.randn(2, 32, 32)
    idx = torch.tensor([3, 1])
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        p_eager, p_comp = pool(4, 2, 16, 16), pool(4, 2, 16, 16)
        y1, c1 = layer(x, p_eager, idx, True)
        y2, c2 = compiled(x, p_comp, idx, True)
        assert torch.equal(y1, y2) and torch.equal(c1, c2) and torch.equal(p_eager, p_comp)
        d1, _ = layer(x[:, :1], p_eager, idx, False)
        d2, _ = compiled(x[:, :1], p_comp, idx, False)
        assert torch.equal(d1, d2) and torch.equal(p_eager, p_comp)


# ------------------------------------------------------------ GPU

@gpu
def test_compile_inductor_gpu():
    torch.manual_seed(0)
    layer = TinyKDA(D=256, H=2, HV=4, K=128, V=128).cuda()
    x = torch.randn(4, 64, 256, device="cuda")
    idx = torch.tensor([5, 1, 0, 7], device="cuda")
    compiled = torch.compile(layer, fullgraph=True)
    with torch.no_grad():
        p1, p2 = pool(8, 4, 128, 128, device="cuda"), pool(8, 4, 128, 128, device="cuda")
        y1, c1 = layer(x, p1, idx, True)
        y2, c2 = compiled(x, p2, idx, True)
        # inductor may compute the projections with other GEMMs: the same kernels on inputs
        # that differ in the last fp32 bits, which can flip an fp16 operand rounding of the
        # prefill (2^-11 = 4.9e-4 relative): 2e-3 bounds that; a wrong op (no pool update, a
        # wrong row, missing checkpoints) is off by O(1)
        torch.testing.assert_close(y2, y1, rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(c2, c1, rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(p2, p1, rtol=2e-3, atol=2e-3)
        d1, _ = layer(x[:, :1], p1, idx, False)
        d2, _ = compiled(x[:, :1], p2, idx, False)
        torch.testing.assert_close(d2, d1, rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(p2, p1, rtol=2e-3, atol=2e-3)


@gpu
def test_decode_cuda_graph_replay_with_new_inputs():
    """Capture one decode step (N = 8, HV = 16, K = V = 128) and replay it with new q, k, v, g,
    β and new indices copied into the captured buffers: each replay equals an eager call on a
    copy of the pool, bit for bit."""
    dev = "cuda"
    q, k, v, g, beta, kw = inputs(8, 1, 8, 16, 128, 128, device=dev, dtype=torch.bfloat16)
    kw["lower_bound"] = -5.0
    p = pool(32, 16, 128, 128, device=dev)
    idx = torch.arange(8, device=dev)
    static = [x.clone() for x in (q, k, v, g, beta)]
    kda_decode(*static, state_pool=p.clone(), state_indices=idx, **kw)  # compile outside
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = kda_decode(*static, state_pool=p, state_indices=idx, **kw)
    for step in range(3):
        new = inputs(8, 1, 8, 16, 128, 128, seed=10 + step, device=dev, dtype=torch.bfloat16)
        rows = torch.randperm(32, device=dev)[:8]
        for dst, src in zip(static, new[:5]):
            dst.copy_(src)
        idx.copy_(rows)
        ref_pool = p.clone()
        ref = kda_decode(*new[:5], state_pool=ref_pool, state_indices=rows, **kw)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref) and torch.equal(p, ref_pool)
