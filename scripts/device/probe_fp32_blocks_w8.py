"""Probe (GPU): the fp32 path's blocks kernel on 8 warps at K = V = 64, the dS pass kept on 4
(autograd caps both at 4 where a program has 64 value columns or fewer, since the dS pass
faulted on 8 there). ``--warps N`` runs the blocks kernel on N warps; prints the gradients'
largest relative difference from the capped run's (saved by ``--save``)."""
import argparse
import sys

import torch

import kdalab.kernels.autograd as ag
from kdalab.kernels import KernelConfig, chunk_kda

ap = argparse.ArgumentParser()
ap.add_argument("--warps", type=int, default=0)
ap.add_argument("--save")
ap.add_argument("--against")
a = ap.parse_args()
if a.warps:
    inner = ag.chunk_kda_bwd_blocks

    def blocks(*args, **kw):
        kw["num_warps"] = a.warps
        return inner(*args, **kw)

    ag.chunk_kda_bwd_blocks = blocks
torch.manual_seed(0)
B, T, H, K = 2, 1000, 4, 64
dev = "cuda"
x = dict(q=torch.randn(B, T, H, K, device=dev), k=torch.randn(B, T, H, K, device=dev),
         v=torch.randn(B, T, H, K, device=dev), g=torch.randn(B, T, H, K, device=dev),
         beta=torch.randn(B, T, H, device=dev))
h0 = torch.randn(B, H, K, K, device=dev)
for t in (*x.values(), h0):
    t.requires_grad_(True)
A = torch.zeros(H, device=dev, requires_grad=True)
dtb = torch.zeros(H * K, device=dev, requires_grad=True)
o, s = chunk_kda(**x, A_log=A, dt_bias=dtb, initial_state=h0, output_final_state=True,
                 config=KernelConfig(dot="fp32"))
(o.square().sum() + s.sum()).backward()
torch.cuda.synchronize()
grads = {n: t.grad.detach().cpu() for n, t in (*x.items(), ("h0", h0), ("A_log", A),
                                              ("dt_bias", dtb))}
if a.save:
    torch.save(grads, a.save)
if a.against:
    ref = torch.load(a.against)
    worst = max(float((grads[n] - ref[n]).norm() / ref[n].norm()) for n in ref)
    print(f"blocks kernel on {a.warps} warps: gradients' largest relative difference from "
          f"4 warps' {worst:.3e}; finite {all(bool(torch.isfinite(g).all()) for g in grads.values())}")
sys.exit(0)
