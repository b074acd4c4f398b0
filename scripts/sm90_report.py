#!/usr/bin/env python3
"""Compile a Triton kernel for sm_90a on a machine without a GPU and report what ptxas says.

Registers per thread, spill stores/loads, shared memory and the tensor-core instructions used
(``wgmma`` / ``mma``) — the facts that decide whether a kernel variant is worth a device call.

    python scripts/sm90_report.py            # the kdalab kernels' configurations
    SM90_PTX_DIR=dir python scripts/sm90_report.py   # also keep each kernel's PTX (no debug
                                                     # info), to compare two versions
    SM90_LINES=20 SM90_ONLY='stage 1' python scripts/sm90_report.py   # and the 20 source lines
                                                     # with the most SASS instructions

Uses the ptxas shipped with triton. Numbers are triton's (this machine's version); the device
may run another triton.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)
#: the NVIDIA tools shipped with triton (ptxas, nvdisasm)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/")
_LINE_INFO = re.compile(r'//## File "([^"]+)", line (\d+)')


def _disassembly(cubin: bytes) -> str | None:
    """The cubin's SASS with source lines (``nvdisasm -g``, shipped with triton); None where
    nvdisasm is not there."""
    nvdisasm = os.path.join(_BIN, "nvdisasm")
    if not os.path.exists(nvdisasm):
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(cubin)
        return subprocess.run([nvdisasm, "-g", "-c", path], capture_output=True,
                              text=True).stdout


def sass_lines(text: str) -> collections.Counter:
    """SASS instructions by the source line nvdisasm names above them ((file's name, line);
    (None, 0) before any): where a kernel's instructions go. Static counts, as ``sass``; a
    helper's lines (triton's ``standard.py`` for tl.sum and tl.cumsum) count where they are
    written, not where they are called."""
    counts: collections.Counter = collections.Counter()
    where = (None, 0)
    for line in text.splitlines():
        m = _LINE_INFO.search(line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
        elif _INSTRUCTION.match(line):
            counts[where] += 1
    return counts


def _ptxas() -> str:
    # triton's PTX may need a newer ptxas than the bundled one: prefer ptxas-blackwell (CUDA 13)
    for name in ("ptxas-blackwell", "ptxas"):
        if os.path.exists(os.path.join(_BIN, name)):
            return os.path.join(_BIN, name)
    return "ptxas"


def report(fn, signature: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 2,
           label: str = "", maxnreg: int | None = None) -> dict:
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
    # as a launch specializes them: pointers (from torch's allocator) and integers that are
    # multiples of 16 carry tt.divisibility = 16 (vectorized loads and stores); without it
    # the compiler assumes unaligned accesses and needs more registers
    aligned = set(os.environ.get("SM90_DIV16", "").split(","))
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if sig[name].startswith("*") or name in aligned}
    if getattr(fn, "is_gluon", lambda: False)():  # a Gluon kernel (chunk_recurrent_ws.py)
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    else:
        src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=TARGET,
                              options={"num_warps": num_warps, "num_stages": num_stages,
                                       **({"maxnreg": maxnreg} if maxnreg else {})})
    ptx = compiled.asm["ptx"]
    if os.environ.get("SM90_PTX_DIR"):  # keep the PTX's instructions (no debug info) to compare
        code = ptx.split("\t.section\t.debug")[0]  # DWARF sections follow the code
        keep = [ln for ln in code.splitlines()  # without debug locations and their labels
                if not ln.lstrip().startswith((".loc", ".file", "//"))
                and not re.fullmatch(r"\$L__tmp\d+:", ln.strip())]
        name = re.sub(r"[^A-Za-z0-9]+", "_", label or jit.__name__) + ".ptx"
        with open(os.path.join(os.environ["SM90_PTX_DIR"], name), "w") as fh:
            fh.write("\n".join(keep))
        with open(os.path.join(os.environ["SM90_PTX_DIR"], name[:-4] + ".ttgir"), "w") as fh:
            fh.write(compiled.asm["ttgir"])  # where the compiler placed waits and copies
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as fh:
            fh.write(ptx)
        out = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", p, "-o", os.path.join(d, "k.o")],
                             capture_output=True, text=True)
    text = out.stderr + out.stdout
    regs = re.search(r"Used (\d+) registers", text)
    sass = _disassembly(compiled.asm["cubin"])
    by_line = sass_lines(sass) if sass is not None else None
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    res = {
        "label": label or jit.__name__,
        "regs": int(regs.group(1)) if regs else None,
        "spill_st": int(spill.group(1)) if spill else None,
        "spill_ld": int(spill.group(2)) if spill else None,
        "smem": compiled.metadata.shared,
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "mma": len(re.findall(r"\bmma\.sync", ptx)),
        # layout conversions through shared memory show as barriers and shared stores
        "bar_sync": len(re.findall(r"\bbar\.sync", ptx)),
        "st_shared": len(re.findall(r"\bst\.shared", ptx)),
        # instructions issued where the kernel has no loop (stage 1's bounded form): an
        # issue-bound kernel's floor, over 4 a cycle an SM
        "sass": sum(by_line.values()) if by_line is not None else None,
    }
    if by_line is not None and os.environ.get("SM90_LINES"):  # the N busiest source lines
        res["lines"] = by_line.most_common(int(os.environ["SM90_LINES"]))
    if regs is None:
        res["ptxas"] = text[-400:]
    return res


def print_row(r: dict) -> None:
    print(f"{r['label']:<36} regs {r['regs']!s:>4}  spill st/ld {r['spill_st']!s:>6}/"
          f"{r['spill_ld']!s:<6} smem {r['smem']:>7}  wgmma {r['wgmma']:>3}  mma {r['mma']:>3}"
          + (f"  sass {r['sass']:>5}" if r.get("sass") else "")
          + (f"  compile {r['compile_s']:.1f} s" if "compile_s" in r else ""), flush=True)
    for (name, line), n in r.get("lines", ()):
        print(f"    {n:6d}  {name}:{line}", flush=True)


def _tensordesc(dtype: str, gdt, block: list) -> str:
    """A TMA descriptor argument's type as a launch specializes it: ``dtype`` tiles of
    ``block`` in their default shared-memory layout (``gdt``: the Gluon type)."""
    from triton.experimental.gluon import language as gl

    layout = gl.NVMMASharedLayout.get_default_for(block, gdt)
    return f"tensordesc<{dtype}[{','.join(map(str, block))}],{layout!r}>"


def ws_signature(K: int, BV: int = 64) -> dict:
    """The Gluon stage 2's arguments as a launch specializes them (its TMA descriptors with
    their shared-memory layouts)."""
    from triton.experimental.gluon import language as gl

    desc = _tensordesc
    ops = {f"{n}_d": desc("fp16", gl.float16, [16, K]) for n in ("w", "qg", "kend", "klo")}
    ptrs = ("cu_seqlens_ptr", "chunk_offsets_ptr", "seq_order_ptr", "idx_ptr", "ck_offsets_ptr")
    return dict(ops, v_d=desc("bf16", gl.bfloat16, [16, BV]),
                ainv_d=desc("fp16", gl.float16, [16, 16]),
                mqk_d=desc("fp16", gl.float16, [16, 16]), o_d=desc("bf16", gl.bfloat16, [16, BV]),
                ck_d=desc("fp32", gl.float32, [K, BV]), o_ptr="*bf16", gamma_ptr="*fp32",
                h0_ptr="*fp32", ht_ptr="*fp32", flag_ptr="*i32", sum_ptr="*fp32", T="i32",
                H="i32", **{n: "*i32" for n in ptrs + ("seg_ptr",)})


def bwd_ws_signature(K: int, dtype: str = "fp16", BV: int = 64) -> dict:
    """The Gluon dS pass's arguments as a launch specializes them (stage 1's operands in
    ``dtype``, fp16 or fp32; dO bf16)."""
    from triton.experimental.gluon import language as gl

    gdt = {"fp16": gl.float16, "fp32": gl.float32}[dtype]
    desc = _tensordesc
    sig = {f"{n}_d": desc(dtype, gdt, [16, K]) for n in ("w", "qg", "kend", "klo")}
    sig.update(mqk_d=desc(dtype, gdt, [16, 16]), do_d=desc("bf16", gl.bfloat16, [16, BV]),
               T="i32", H="i32")
    sig.update({n: "*fp32" for n in ("gamma_ptr", "dht_ptr", "sum_ptr", "ends_ptr", "du_ptr")})
    sig.update({n: "*i32" for n in ("cu_seqlens_ptr", "chunk_offsets_ptr", "seq_order_ptr",
                                    "seg_ptr", "seg_off_ptr")})
    return sig


def kdalab_rows(only: str | None = None):
    """The Triton KDA kernels (forward and backward) at K = V = 128 (the benchmarks' head
    dims); ``only``: the labels containing it."""
    import time

    import triton.language as tl

    from kdalab.kernels.chunk_blocks_bwd import (
        chunk_kda_bwd_blocks_kernel,
        chunk_kda_bwd_dv_kernel,
    )
    from kdalab.kernels.chunk_combine import chunk_kda_combine_kernel
    from kdalab.kernels.chunk_prepare import PREPARE_MAXNREG, chunk_kda_prepare_kernel
    from kdalab.kernels.chunk_prepare_bwd import chunk_kda_prepare_bwd_kernel
    from kdalab.kernels.chunk_recurrent import chunk_kda_recurrent_kernel
    from kdalab.kernels.chunk_recurrent_bwd import chunk_kda_bwd_recurrent_kernel
    from kdalab.kernels.chunk_recurrent_ws import chunk_kda_recurrent_ws_kernel
    from kdalab.kernels.launch_plan import blocks_kernel_stages

    def timed(*args, **kw):
        if only and only not in kw["label"]:
            return None
        t0 = time.perf_counter()
        row = report(*args, **kw)
        row["compile_s"] = time.perf_counter() - t0
        return row

    prep = dict(q_ptr="*bf16", k_ptr="*bf16", g_ptr="*bf16", beta_ptr="*bf16",
                a_log_ptr="*fp32", dt_bias_ptr="*fp32", w_ptr="*fp16", qg_ptr="*fp16",
                kend_ptr="*fp16", klo_ptr="*fp16", ainv_ptr="*fp16", mqk_ptr="*fp16",
                gamma_ptr="*fp32",
                chunk_table_ptr="*i32", wide_ptr="*i32", aux_ptr="*fp32", T="i32",
                scale="fp32", lower_bound="fp32", H="i32")
    ce = dict(K=128, BT=16, GATE=0, SPAN_CHECK=False, HAS_A_LOG=True, HAS_DT_BIAS=True,
              USE_L2NORM=True, BETA_LOGITS=True, IS_VARLEN=False)
    # rows in whole chunks (fixed length, T % 16 == 0) masked; other rows (varlen, or a
    # ragged tail) clamped; the span-checked gates (softplus, log-decay) with their per-pair
    # path
    for nw in (2, 4):
        yield timed(chunk_kda_prepare_kernel, prep, ce, num_warps=nw, label=f"stage 1 w{nw}")
    yield timed(chunk_kda_prepare_kernel, prep, dict(ce, IS_VARLEN=True, CLAMP_ROWS=True),
                num_warps=2, label="stage 1 varlen w2")
    # with the register cap chunk_kda_prepare launches it under
    yield timed(chunk_kda_prepare_kernel, prep, dict(ce, CLAMP_ROWS=True), num_warps=2,
                label="stage 1 ragged w2", maxnreg=PREPARE_MAXNREG)
    # the span-checked gates: the first launch (a wide chunk flagged) and the flagged chunks'
    # second launch (REDO: the per-pair path)
    for gate, name in ((1, "softplus"), (2, "log-decay")):
        for redo in (False, True):
            yield timed(chunk_kda_prepare_kernel, prep,
                        dict(ce, GATE=gate, SPAN_CHECK=True, REDO=redo), num_warps=2,
                        label=f"stage 1 {name} w2" + (" redo" if redo else ""))
    # the backward's recompute (3xTF32 products), without and with the record stage 1's
    # backward reads (AUX: BWD_MODE prep_aux)
    for aux in (False, True):
        yield timed(chunk_kda_prepare_kernel, prep, dict(ce, PRECISION="tf32x3", AUX=aux),
                    num_warps=2, label="stage 1 recompute w2" + (" aux" if aux else ""))
    sig = dict(v_ptr="*bf16", w_ptr="*fp16", qg_ptr="*fp16", kend_ptr="*fp16", klo_ptr="*fp16",
               ainv_ptr="*fp16", mqk_ptr="*fp16", gamma_ptr="*fp32", h0_ptr="*fp32",
               ht_ptr="*fp32", o_ptr="*bf16", sum_ptr="*fp32", cu_seqlens_ptr="*i32",
               chunk_offsets_ptr="*i32", seq_order_ptr="*i32", seg_ptr="*i32",
               seg_off_ptr="*i32", T="i32",
               H="i32")
    # "fp16-launch": the guard's first launch (it flags; KernelConfig.fp16_guard="launch"),
    # "redo" its second
    flagged = dict(sig, flag_ptr="*i32")
    for pass_, bv, nw, dt, h0 in ((0, 64, 4, "fp16", False), (0, 64, 4, "fp16", True),
                                  (0, 128, 8, "fp16", False), (0, 128, 8, "fp16", True),
                                  (0, 64, 4, "fp16-launch", True), (0, 64, 4, "redo", True),
                                  (0, 128, 8, "fp16-launch", True), (0, 128, 8, "redo", True),
                                  (0, 64, 4, "tf32", False),
                                  (1, 64, 4, "fp16", False), (1, 64, 4, "fp16", True),
                                  (2, 64, 4, "fp16", False), (2, 64, 4, "fp16", True),
                                  (2, 64, 4, "fp16-launch", True)):
        ce = dict(K=128, V=128, BT=16, BV=bv, HAS_H0=h0, STORE_HT=h0, STATE_VK=False,
                  IS_VARLEN=False, PASS=pass_, SKIP_LAST=True,
                  DT=tl.float32 if dt == "tf32" else tl.float16, GUARD=dt == "fp16",
                  FLAG={"fp16-launch": 1, "redo": 2}.get(dt, 0))
        yield timed(chunk_kda_recurrent_kernel, flagged if ce["FLAG"] else sig, ce,
                    num_warps=nw,
                    label=f"stage 2 pass {pass_} {dt} BV{bv} w{nw}" + (" state" if h0 else ""))
    # the warp-specialized Gluon prototype of the serial pass (BV 64, a loader warp)
    for k, h0, varlen, ckc, pass_ in ((128, True, False, 0, 0), (128, False, False, 0, 0),
                                      (64, True, False, 0, 0), (128, True, True, 0, 0),
                                      (128, True, True, 4, 0), (128, True, False, 0, 1),
                                      (128, True, False, 4, 2)):
        yield timed(chunk_kda_recurrent_ws_kernel, ws_signature(k), dict(
            K=k, V=128, BV=64, NUM_STAGES=3, HAS_H0=h0, STORE_HT=h0, STATE_VK=False,
            IS_VARLEN=varlen, HAS_IDX=ckc > 0, CKC=ckc, FULL=not varlen, PASS=pass_,
            NV=(128 + k if pass_ == 1 else 128) // 64, num_warps=4), num_warps=4, maxnreg=128,
            label=f"stage 2 gluon ws pass {pass_} K{k} BV64" + (" state" if h0 else "")
            + (" varlen" if varlen else "") + (f" pool ck{ckc}" if ckc else ""))
    # serving: the pool (a state row by index) with and without checkpoints every 64 tokens
    # (CKC = 4 chunks, through a tensor descriptor), both state layouts, value blocks of 32
    # and 64 on 4 warps, 128 on 8
    pool = dict(sig, idx_ptr="*i32", ck_ptr="*fp32", ck_offsets_ptr="*i32")
    for pass_ in (0, 2):
        for vk in (False, True):
            # the serial pass at BV 128 runs the guard's redo as a second launch (plan.py)
            for bv, nw, launch in ((64, 4, False), (32, 4, False), (128, 8, False),
                                   (128, 8, True)):
                for ckc in (0, 4):
                    ce = dict(K=128, V=128, BT=16, BV=bv, HAS_H0=True, STORE_HT=True,
                              STATE_VK=vk, IS_VARLEN=False, PASS=pass_, SKIP_LAST=True,
                              DT=tl.float16, GUARD=not launch, HAS_IDX=True, CKC=ckc,
                              FLAG=1 if launch else 0)
                    block = f"1,{bv},128" if vk else f"1,128,{bv}"
                    base = dict(pool, flag_ptr="*i32") if launch else pool
                    sig_ck = dict(base, ck_ptr=f"tensordesc<fp32[{block}]>") if ckc else base
                    yield timed(chunk_kda_recurrent_kernel, sig_ck, ce, num_warps=nw,
                                label=f"pool pass {pass_} {'VK' if vk else 'KV'} BV{bv} w{nw}"
                                      + (" launch" if launch else "")
                                      + (f" ck{ckc}" if ckc else ""))
    comb = dict(sum_ptr="*fp32", seg_offsets_ptr="*i32", h0_ptr="*fp32", H="i32")
    yield timed(chunk_kda_combine_kernel, comb, dict(K=128, V=128, BV=16, HAS_H0=True,
                                                     STATE_VK=False), num_warps=8,
                label="combine BV16 w8")
    # the backward: the dS recurrence (serial or segments, summaries), the blocks kernel and
    # stage 1's backward
    bwd = dict(v_ptr="*bf16", do_ptr="*bf16", w_ptr="*fp16", qg_ptr="*fp16",
               kend_ptr="*fp16", klo_ptr="*fp16", ainv_ptr="*fp16", mqk_ptr="*fp16",
               gamma_ptr="*fp32", h0_ptr="*fp32", ck_ptr="*fp32", ck_offsets_ptr="*i32",
               dht_ptr="*fp32", dv_ptr="*bf16", dqg_ptr="*fp32", dw_ptr="*fp32",
               dkend_ptr="*fp32", dgam_ptr="*fp32", dmqk_ptr="*fp32", dainv_ptr="*fp32",
               dh0_ptr="*fp32", scratch_ptr="*fp32", sum_ptr="*fp32", ends_ptr="*fp32",
               du_ptr="*fp32", cu_seqlens_ptr="*i32", chunk_offsets_ptr="*i32",
               seq_order_ptr="*i32", seg_ptr="*i32", seg_off_ptr="*i32", T="i32",
               n_items="i32", part_tok="i32", part_gam="i32", part_cc="i32", H="i32")
    rec = {n: bwd[n] for n in ("do_ptr", "w_ptr", "qg_ptr", "kend_ptr", "klo_ptr", "mqk_ptr",
                               "gamma_ptr", "dht_ptr", "sum_ptr", "ends_ptr", "du_ptr",
                               "cu_seqlens_ptr", "chunk_offsets_ptr", "seq_order_ptr",
                               "seg_ptr", "seg_off_ptr", "T", "H")}
    for pass_, seg, bv, nw in ((3, False, 128, 8), (3, True, 128, 8), (1, True, 128, 8),
                               (3, False, 64, 4)):
        ce = dict(K=128, V=128, BT=16, BV=bv, CKC=4, HAS_DHT=True, STATE_VK=False,
                  IS_VARLEN=False, PASS=pass_, SEG=seg)
        yield timed(chunk_kda_bwd_recurrent_kernel, rec, ce, num_warps=nw, num_stages=1,
                    label=f"bwd dS pass {pass_}{' seg' if seg else ''} BV{bv} w{nw}")
    # the blocks kernel, and the dV kernel (dV and dAINV, taken out of it)
    blk = {n: bwd[n] for n in ("v_ptr", "do_ptr", "du_ptr", "w_ptr", "qg_ptr", "kend_ptr",
                               "klo_ptr", "ainv_ptr", "gamma_ptr", "h0_ptr",
                               "ck_ptr", "ck_offsets_ptr", "ends_ptr", "dqg_ptr",
                               "dw_ptr", "dkend_ptr", "dgam_ptr", "dmqk_ptr",
                               "dh0_ptr", "scratch_ptr", "seg_ptr", "n_items", "part_tok",
                               "part_gam", "part_cc", "H")}
    # DKEND_OVER_DU (autograd.BWD_MODE["dkend_over_du"]): a barrier before each dKEND store
    for bv, nw, h0, over in ((128, 8, True, True), (128, 8, False, True),
                             (128, 8, True, False), (64, 4, True, False)):
        ce = dict(K=128, V=128, BT=16, BV=bv, CKC=4, HAS_H0=h0, STORE_DH0=h0,
                  STATE_VK=False, DKEND_OVER_DU=over)
        ns = blocks_kernel_stages(h0)  # as the launcher picks them
        yield timed(chunk_kda_bwd_blocks_kernel, blk, ce, num_warps=nw, num_stages=ns,
                    label=f"bwd blocks BV{bv} w{nw}{' h0' if h0 else ''} s{ns}"
                          + (" over-dU" if over else ""))
    for varlen in (False, True):
        yield timed(chunk_kda_bwd_dv_kernel, dict(
            v_ptr="*bf16", du_ptr="*fp32", ainv_ptr="*fp16", dv_ptr="*bf16", dainv_ptr="*fp32",
            chunk_table_ptr="*i32", T="i32", H="i32", part_cc="i32"),
            dict(V=128, BT=16, BV=128, IS_VARLEN=varlen), num_warps=4,
            label="bwd dv BV128 w4" + (" varlen" if varlen else ""))
    pbwd = dict(q_ptr="*bf16", k_ptr="*bf16", g_ptr="*bf16", beta_ptr="*bf16",
                a_log_ptr="*fp32", dt_bias_ptr="*fp32", dqg_ptr="*fp32", dw_ptr="*fp32",
                dkend_ptr="*fp32", dgam_ptr="*fp32", dmqk_ptr="*fp32", dainv_ptr="*fp32",
                dq_ptr="*bf16", dk_ptr="*bf16", dg_ptr="*bf16", db_ptr="*bf16",
                dalog_ptr="*fp32", ddt_ptr="*fp32", chunk_table_ptr="*i32",
                aux_ptr="*fp32", T="i32", scale="fp32", lower_bound="fp32", H="i32")
    ce = dict(K=128, BT=16, GATE=0, SPAN_CHECK=False, HAS_A_LOG=True, HAS_DT_BIAS=True,
              USE_L2NORM=True, BETA_LOGITS=True, IS_VARLEN=False)
    from kdalab.kernels.autograd import BWD_MODE
    cap = dict(num_stages=BWD_MODE["prep_stages"] or 3, maxnreg=BWD_MODE["prep_maxnreg"] or None)
    tag = f" s{cap['num_stages']} r{cap['maxnreg']}"  # as the launcher runs it
    for bk, nw, kw in ((32, 4, cap), (32, 4, {}), (32, 2, {}), (64, 4, {})):
        yield timed(chunk_kda_prepare_bwd_kernel, pbwd, dict(ce, BK=bk), num_warps=nw,
                    label=f"bwd stage 1 BK{bk} w{nw}{tag if kw else ''}", **kw)
    yield timed(chunk_kda_prepare_bwd_kernel, pbwd, dict(ce, BK=32, AUX=True), num_warps=4,
                label=f"bwd stage 1 BK32 w4{tag} aux", **cap)
    yield timed(chunk_kda_prepare_bwd_kernel, pbwd, dict(ce, BK=32, GATE=1, SPAN_CHECK=True),
                num_warps=4, label=f"bwd stage 1 BK32 softplus w4{tag}", **cap)
    # the fp32 path (KernelConfig(dot="fp32")): stage 1 stored in fp32 with 3xTF32 products,
    # stage 2 and the reverse pass with every product 3xTF32, at K = V = 64 and 128
    f32 = {n: "*fp32" for n in ("w_ptr", "qg_ptr", "kend_ptr", "klo_ptr", "ainv_ptr",
                                "mqk_ptr")}
    for k in (64, 128):
        yield timed(chunk_kda_prepare_kernel, dict(prep, **f32),
                    dict(ce, K=k, PRECISION="tf32x3", SUBST=True), num_warps=2,
                    label=f"fp32 path stage 1 K{k} w2")
        yield timed(chunk_kda_prepare_bwd_kernel, pbwd, dict(ce, K=k, BK=32, SUBST=True),
                    num_warps=4, label=f"fp32 path bwd stage 1 K{k} BK32 w4{tag}", **cap)
        for bv, nw in ((64, 4), (128, 8)):
            yield timed(chunk_kda_recurrent_kernel, dict(sig, **f32), dict(
                K=k, V=k, BT=16, BV=min(bv, k), HAS_H0=True, STORE_HT=True, STATE_VK=False,
                IS_VARLEN=False, PASS=0, SKIP_LAST=True, DT=tl.float32, GUARD=False,
                PREC="tf32x3"), num_warps=nw,
                label=f"fp32 path stage 2 K{k} BV{min(bv, k)} w{nw}")
        bv = min(128, k)
        yield timed(chunk_kda_bwd_recurrent_kernel, dict(rec, **{n: "*fp32" for n in (
            "w_ptr", "qg_ptr", "kend_ptr", "klo_ptr", "mqk_ptr")}), dict(
            K=k, V=k, BT=16, BV=bv, CKC=4, HAS_DHT=True, STATE_VK=False, IS_VARLEN=False,
            PASS=3, SEG=False, PREC="tf32x3"), num_warps=8, num_stages=1,
            label=f"fp32 path bwd dS pass K{k} BV{bv} w8")
        yield timed(chunk_kda_bwd_blocks_kernel, dict(blk, **{n: "*fp32" for n in (
            "w_ptr", "qg_ptr", "kend_ptr", "klo_ptr", "ainv_ptr")}), dict(
            K=k, V=k, BT=16, BV=bv, CKC=4, HAS_H0=True, STORE_DH0=True, STATE_VK=False,
            DKEND_OVER_DU=True, PREC="tf32x3"), num_warps=8,
            num_stages=blocks_kernel_stages(True),
            label=f"fp32 path bwd blocks K{k} BV{bv} w8 h0")


if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    print(f"triton {triton.__version__}, target sm_90a, ptxas {_ptxas()}")
    only = os.environ.get("SM90_ONLY")  # a substring of the labels to report
    for row in kdalab_rows(only):
        if row is not None:
            print_row(row)
