#!/usr/bin/env python3
"""Compile a Triton kernel for sm_90a on a machine without a GPU and report what ptxas says.

Registers per thread, spill stores/loads, shared memory and the tensor-core instructions used
(``wgmma`` / ``mma``) — the facts that decide whether a kernel variant is worth a device call.

    python scripts/sm90_report.py            # the kdalab kernels' configurations
    SM90_PTX_DIR=dir python scripts/sm90_report.py   # also keep each kernel's PTX (no debug
                                                     # info), to compare two versions

Uses the ptxas shipped with triton. Numbers are triton's (this machine's version); the device
may run another triton.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)


def _ptxas() -> str:
    # triton's PTX may need a newer ptxas than the bundled one: prefer ptxas-blackwell (CUDA 13)
    base = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for name in ("ptxas-blackwell", "ptxas"):
        if os.path.exists(os.path.join(base, name)):
            return os.path.join(base, name)
    return "ptxas"


def report(fn, signature: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 2,
           label: str = "") -> dict:
    """Compile ``fn`` (a triton.jit function) for sm_90a; return regs, spills, smem, mma counts."""
    import inspect

    jit = getattr(fn, "fn", fn)
    defaults = {n: p.default for n, p in inspect.signature(jit).parameters.items()
                if p.default is not inspect.Parameter.empty}
    constexprs = {**{n: v for n, v in defaults.items() if n not in signature}, **constexprs}
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        else:
            sig[name] = signature[name]
    src = ASTSource(fn, sig, constexprs=constexprs)
    compiled = triton.compile(src, target=TARGET,
                              options={"num_warps": num_warps, "num_stages": num_stages})
    ptx = compiled.asm["ptx"]
    if os.environ.get("SM90_PTX_DIR"):  # keep the PTX's instructions (no debug info) to compare
        code = ptx.split("\t.section\t.debug")[0]  # DWARF sections follow the code
        keep = [ln for ln in code.splitlines()  # without debug locations and their labels
                if not ln.lstrip().startswith((".loc", ".file", "//"))
                and not re.fullmatch(r"\$L__tmp\d+:", ln.strip())]
        name = re.sub(r"[^A-Za-z0-9]+", "_", label or jit.__name__) + ".ptx"
        with open(os.path.join(os.environ["SM90_PTX_DIR"], name), "w") as fh:
            fh.write("\n".join(keep))
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as fh:
            fh.write(ptx)
        out = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", p, "-o", os.path.join(d, "k.o")],
                             capture_output=True, text=True)
    text = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    res = {
        "label": label or jit.__name__,
        "regs": int(regs.group(1)) if regs else None,
        "spill_st": int(spill.group(1)) if spill else None,
        "spill_ld": int(spill.group(2)) if spill else None,
        "smem": compiled.metadata.shared,
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "mma": len(re.findall(r"\bmma\.sync", ptx)),
    }
    if regs is None:
        res["ptxas"] = text[-400:]
    return res


def print_row(r: dict) -> None:
    print(f"{r['label']:<40} regs {r['regs']!s:>4}  spill st/ld {r['spill_st']!s:>6}/"
          f"{r['spill_ld']!s:<6} smem {r['smem']:>7}  wgmma {r['wgmma']:>3}  mma {r['mma']:>3}",
          flush=True)


def kdalab_rows():
    """The Triton KDA forward's kernels at H = 64, K = V = 128 (the benchmark's shape)."""
    import triton.language as tl

    from kdalab.kernels.chunk_prepare import chunk_kda_prepare_kernel
    from kdalab.kernels.chunk_recurrent_t import chunk_kda_recurrent_t_kernel

    prep = dict(q_ptr="*bf16", k_ptr="*bf16", g_ptr="*bf16", beta_ptr="*bf16",
                a_log_ptr="*fp32", dt_bias_ptr="*fp32", w_ptr="*fp16", qg_ptr="*fp16",
                kend_ptr="*fp16", ainv_ptr="*fp16", mqk_ptr="*fp16", gamma_ptr="*fp32",
                chunk_table_ptr="*i32", cu_seqlens_ptr="*i32", T="i32", scale="fp32",
                lower_bound="fp32")
    ce = dict(H=64, K=128, BT=16, HAS_A_LOG=True, HAS_DT_BIAS=True, USE_L2NORM=True,
              BETA_LOGITS=True, IS_VARLEN=False, FP16_INVERSE=False)
    for nw in (2, 4, 8):
        for prec in ("ieee", "tf32x3"):
            yield report(chunk_kda_prepare_kernel, prep, dict(ce, INV_PRECISION=prec),
                         num_warps=nw, label=f"stage 1 inverse {prec} w{nw}")
    for dot, opd in (("tf32", "fp16"), ("bf16", "bf16"), ("fp16", "fp16")):
        sig = dict(v_ptr="*bf16", w_ptr=f"*{opd}", qg_ptr=f"*{opd}", kend_ptr=f"*{opd}",
                   ainv_ptr=f"*{opd}", mqk_ptr=f"*{opd}", gamma_ptr="*fp32", h0_ptr="*fp32",
                   ht_ptr="*fp32", o_ptr="*bf16", cu_seqlens_ptr="*i32",
                   chunk_offsets_ptr="*i32", flag_ptr="*i32", T="i32")
        # FLAG: 1 = the guarded fp16 pass records out-of-range programs, 2 = the tf32 pass
        # that recomputes only those
        flags = {"fp16": (0, 1), "tf32": (0, 2)}.get(dot, (0,))
        for bv, nw, pf, flag in [(64, 4, True, f) for f in flags] + [
                (64, 4, False, 0), (64, 8, True, 0), (128, 8, True, 0)]:
            ce = dict(H=64, K=128, V=128, BT=16, BV=bv, HAS_H0=False, STORE_HT=False,
                      STATE_VK=False, IS_VARLEN=False, PREFETCH=pf, FLAG=flag,
                      DT={"tf32": tl.float32, "bf16": tl.bfloat16, "fp16": tl.float16}[dot])
            yield report(chunk_kda_recurrent_t_kernel, sig, ce, num_warps=nw,
                         label=f"stage 2 t {dot} BV{bv} w{nw}" + (" prefetch" if pf else "")
                         + (f" flag{flag}" if flag else ""))

    from kdalab.kernels.chunk_fused import chunk_kda_fused_kernel

    fused = dict(q_ptr="*bf16", k_ptr="*bf16", g_ptr="*bf16", beta_ptr="*bf16",
                 a_log_ptr="*fp32", dt_bias_ptr="*fp32", v_ptr="*bf16", h0_ptr="*fp32",
                 ht_ptr="*fp32", o_ptr="*bf16", cu_seqlens_ptr="*i32", flag_ptr="*i32",
                 T="i32", scale="fp32", lower_bound="fp32")
    for dot, flag, nw in (("fp16", 1, 4), ("fp16", 1, 8), ("tf32", 2, 4)):
        ce = dict(H=64, K=128, V=128, BT=16, BV=64, HAS_A_LOG=True, HAS_DT_BIAS=True,
                  USE_L2NORM=True, BETA_LOGITS=True, FP16_INVERSE=False, INV_PRECISION="ieee",
                  HAS_H0=False, STORE_HT=False, STATE_VK=False, IS_VARLEN=False,
                  DT={"tf32": tl.float32, "fp16": tl.float16}[dot], OPD=tl.float16, FLAG=flag)
        yield report(chunk_kda_fused_kernel, fused, ce, num_warps=nw,
                     label=f"fused {dot} BV64 w{nw} flag{flag}")


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    print(f"triton {triton.__version__}, target sm_90a, ptxas {_ptxas()}")
    for row in kdalab_rows():
        print_row(row)
