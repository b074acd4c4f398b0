"""Stage 1 (and the serial recurrent pass) of the Triton forward at one grid shape, for Nsight
Compute: warm-up calls, then one profiled call of each kernel. Run by stage1_profile.sh."""

import sys

import torch

sys.path.insert(0, "benchmarks")
from bench_kernel import SHAPES, make_inputs, run_kdalab  # noqa: E402

from kdalab.kernels import KernelConfig  # noqa: E402

x = make_inputs(SHAPES[sys.argv[1]])
cfg = KernelConfig()
for _ in range(3):
    run_kdalab(x, cfg)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
run_kdalab(x, cfg)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
