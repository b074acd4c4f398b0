"""Inputs and the child-process runner shared by the serving tests (decode, the pool and
checkpoint paths, GVA, custom ops, kdalab.compat.fla).

Interpreter tests are named ``test_interp_*``: they run under TRITON_INTERPRET=1 in one child
pytest process (``run_interpreter_tests``, called from tests/test_decode.py), so the
interpreter never leaks into other test modules; GPU tests are marked ``gpu``."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from kdalab.arith import rel_rmse

INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
FILES = ("test_decode.py", "test_kernel_pool.py", "test_custom_ops.py", "test_compat_fla.py")
# a bound of -1: at most e^-1 of decay a token, so a state carries over many tokens and a
# wrong start state or a lost update shows in the outputs (at -5 it is gone within a chunk)
LOWER_BOUND = -1.0


def inputs(N, T, H, HV, K, V, *, seed=0, device="cpu", dtype=torch.float32, gate_heads=None):
    """(q, k, v, g, beta, kw) with raw gate and β logits, A_log and dt_bias per gate head."""
    gen = torch.Generator().manual_seed(seed)
    HG = gate_heads or HV
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k, g = r(N, T, H, K), r(N, T, H, K), r(N, T, HG, K)
    v, beta = r(N, T, HV, V), r(N, T, HV)
    kw = dict(A_log=(r(HG) * 0.3).to(device), dt_bias=(r(HG * K) * 0.3).to(device),
              lower_bound=LOWER_BOUND)
    return tuple(x.to(device=device, dtype=dtype) for x in (q, k, v, g, beta)) + (kw,)


def pool(P, HV, K, V, *, seed=1, layout="KV", dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    shape = (P, HV, K, V) if layout == "KV" else (P, HV, V, K)
    return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)


def err(x, ref):
    """Relative RMS error over the whole tensor (the relative Frobenius error)."""
    return float(rel_rmse(x, ref, x.dim()))


def run_interpreter_tests(tmp_path: Path, files=FILES, timeout=600) -> list[str]:
    """Run every ``test_interp_*`` of ``files`` (names in tests/) in one TRITON_INTERPRET=1
    child; all must pass (a skip, a deselect or a failure fails). Results are read from its
    JUnit report; returns the names of the tests that ran."""
    here = Path(__file__).parent
    report = tmp_path / "interp.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "interp_",
         f"--junitxml={report}", *(str(here / f) for f in files)],
        env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True,
        timeout=timeout)
    log = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, log
    cases = list(ET.parse(report).getroot().iter("testcase"))
    bad = [c.get("name") for c in cases
           if any(c.find(t) is not None for t in ("failure", "error", "skipped"))]
    assert cases and not bad, (bad, log)
    names = [c.get("name") for c in cases]
    assert all(n.startswith("test_interp_") for n in names), names
    return names


def interp_test_count(namespace: dict) -> int:
    """How many test_interp_* cases a module's ``namespace`` defines (parametrizations
    multiplied out): what its interpreter child must have run."""
    count = 0
    for name, fn in list(namespace.items()):
        if name.startswith("test_interp_") and callable(fn):
            n = 1
            for mark in getattr(fn, "pytestmark", []):
                if mark.name == "parametrize":
                    n *= len(mark.args[1])
            count += n
    return count


def stage1_clamped_and_masked(q, k, g, beta, *, A_log, dt_bias, lower_bound, cu_seqlens=None):
    """Stage 1's operands (W, QG, KEND, KLO, AINV, MQK, GAMMA) with the loads' rows clamped
    to the sequence and with every load masked by row, for the tests that compare the two
    bit for bit (``chunk_prepare``: clamped where rows are not known to come in whole
    chunks)."""
    from kdalab.kernels import KernelConfig, api
    from kdalab.kernels.chunk_prepare import chunk_kda_prepare
    from kdalab.kernels.contract import prefill_problem

    v = q.new_zeros(tuple(beta.shape) + (q.shape[-1],))  # the value heads: beta's
    p = prefill_problem(q, k, v, g, beta, scale=None, initial_state=None, A_log=A_log,
                        dt_bias=dt_bias, gate="raw", lower_bound=lower_bound,
                        cu_seqlens=cu_seqlens, use_qk_l2norm=True, beta_is_logits=True,
                        state_layout="KV", config=KernelConfig())
    seqs = api.sequences_for(p, cu_seqlens, q.device)
    plan = api.plan_for(seqs, p, KernelConfig())  # stage 1 takes only its warps from it
    return [chunk_kda_prepare(q, k, g, beta, A_log, dt_bias.reshape(-1), p, seqs,
                              num_warps=plan.prepare_warps, clamp_rows=clamp)
            for clamp in (True, False)]
