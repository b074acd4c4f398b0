"""Speed and accuracy of kdalab.kernels.chunk_kda_fwd against fla's chunk_kda, same process.

Speed: median ms (triton.testing.do_bench) at B=1, T=8192, D=128, H in (64, 96), fixed length
and varlen [1300, 547, 2048, 963, 271, 3063]; fla runs with safe_gate=True, lower_bound=-5,
the gate (A_log, dt_bias), L2 norm and β sigmoid in its kernel. Achieved bandwidth counts the
fewest bytes a forward must move (q, k, v, g, β read once, o written once) and is printed
against the device-to-device copy bandwidth measured in the same run (bytes read + written).

Inputs: the end-to-end study's families (kdalab.experiments.end_to_end.study_inputs) at lower
bound -5. Accuracy: relative RMS error over the whole tensor (kdalab.arith.rel_rmse, i.e. the
relative Frobenius error) of o and of the final state against the fp64 token recurrence
(kdalab.kda.reference_forward), for kdalab and fla on the same inputs, per family.

    python benchmarks/bench_kernel.py [--sweep | --configs a,b] [--accuracy] [--stages]
                                      [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time

import torch
import triton

from kdalab.arith import rel_rmse
from kdalab.experiments.end_to_end import E2E_FAMILIES, study_inputs
from kdalab.kda import reference_forward
from kdalab.kernels import TF32_CONFIG, KernelConfig, chunk_kda_fwd
from kdalab.kernels.chunk_kda import _resolve_dot

FAMILIES = tuple(f for f in E2E_FAMILIES if f != "long")  # "long" is a length; T is fixed here
LOWER_BOUND = -5.0
VARLEN = [1300, 547, 2048, 963, 271, 3063]
T_TOTAL = 8192
D = 128


def _tf32(**changes):
    """A variant of the tf32 configuration (the default before 2026-11-29; stage 1 on 8 warps)."""
    return dataclasses.replace(TF32_CONFIG, **changes)


SWEEP = {
    # the earlier default: tf32 recurrent products, stage 1 on 8 warps
    "tf32": TF32_CONFIG,
    # the stage-2 loads: hand-pipelined (prefetch, default) or issued in the step
    "t_nopf": _tf32(prefetch=False),
    "t_w8": _tf32(num_warps=8),
    "t_bv128_w8": _tf32(block_v=128, num_warps=8),
    "t_bv32": _tf32(block_v=32),
    "t_bf16": _tf32(dot="bf16"),
    "t_bf16_nopf": _tf32(dot="bf16", prefetch=False),
    "t_bf16_w8": _tf32(dot="bf16", num_warps=8),
    "t_bf16_bv128_w8": _tf32(dot="bf16", block_v=128, num_warps=8),
    "kv_bv64_w8": _tf32(variant="kv", block_v=64, num_warps=8),
    # fp16 products in stage 2; stage 1's warps; the fp32 inverse on tensor cores (3xTF32)
    "t_fp16": _tf32(dot="fp16"),
    "prep_w4": _tf32(prepare_warps=4),
    "prep_w2": _tf32(prepare_warps=2),
    "fast": _tf32(dot="fp16", prepare_warps=4),  # FAST_CONFIG as measured in session 2
    "prep_w16": _tf32(prepare_warps=16),
    "inv_tf32x3": _tf32(inverse="tf32x3"),
    "t_fp16_tf32x3": _tf32(dot="fp16", inverse="tf32x3"),
    "fast_tf32x3": _tf32(dot="fp16", prepare_warps=4, inverse="tf32x3"),
    # stage 1 on 2 warps (255 registers, no spills: scripts/sm90_report.py): the default since
    # 2026-11-29 with the fp16 range guard; without the guard
    "fast_w2": _tf32(dot="fp16", prepare_warps=2, fp16_fallback=False),
    "fast_w2_tf32x3": _tf32(dot="fp16", prepare_warps=2, inverse="tf32x3"),
    "no_guard": KernelConfig(fp16_fallback=False),
    # 64-token steps (experimental; spill registers on sm_90, scripts/sm90_report.py)
    "s64_kv_bv64": _tf32(step=64, variant="kv", block_v=64, prepare_warps=None),
}
ACCURACY_CONFIGS = {
    "default": KernelConfig(),
    "tf32": TF32_CONFIG,
    "inv_tf32x3": _tf32(inverse="tf32x3"),
    "t_bf16": _tf32(dot="bf16"),
    "t_fp16": _tf32(dot="fp16"),
    "fast": SWEEP["fast"],
    "fast_w2": SWEEP["fast_w2"],
}
STAGE_CONFIGS = ("default", "tf32", "no_guard", "t_bf16", "inv_tf32x3")


def _fla():
    try:
        from fla.ops.kda import chunk_kda
    except Exception as exc:  # noqa: BLE001 - report and go on without the baseline
        print(f"fla unavailable: {exc!r}")
        return None
    return chunk_kda


def copy_bandwidth(nbytes=4 << 30):
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").uniform_()
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / (ms * 1e-3), ms


def min_bytes(T, H, K, V):
    return T * H * (3 * K + V) * 2 + T * H * 2 + T * H * V * 2  # q k g, v; beta; o


def rel_err(x, ref):
    return float(rel_rmse(x, ref, x.dim()))


def inputs(family, H, varlen, seed=0):
    kw = study_inputs(family, LOWER_BOUND, seed, T_TOTAL, H, D)  # drawn on the CPU
    x = tuple(kw[n].to("cuda") for n in ("q", "k", "v", "g", "beta"))
    cu = None
    if varlen:
        cu = torch.tensor([0, *itertools.accumulate(VARLEN)], device="cuda")
    gate = dict(A_log=kw["A_log"].float().cuda(), dt_bias=kw["dt_bias"].float().flatten().cuda())
    return x, gate, cu


def run_kdalab(x, kw, cu, h0=None, final=False, config=KernelConfig()):
    return chunk_kda_fwd(*x, **kw, cu_seqlens=cu, initial_state=h0, output_final_state=final,
                         lower_bound=LOWER_BOUND, config=config)


def run_fla(chunk_kda, x, kw, cu, h0=None, final=False):
    with torch.no_grad():
        return chunk_kda(*x, **kw, cu_seqlens=cu, initial_state=h0, output_final_state=final,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                         use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=LOWER_BOUND)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=50, rep=250, return_mode="median")


def speed(chunk_kda, copy_bw, configs, shapes):
    rows = []
    for H, varlen in shapes:
        x, kw, cu = inputs("model_like", H, varlen)
        row = dict(H=H, varlen=varlen)
        t = {}
        for name, cfg in configs.items():
            try:
                t[name] = bench(lambda cfg=cfg: run_kdalab(x, kw, cu, config=cfg))
            except Exception as exc:  # e.g. a launch shape that needs too much shared memory
                print(json.dumps(dict(H=H, varlen=varlen, config=name,
                                      failed=f"{type(exc).__name__}: {exc}"[:300])),
                      flush=True)
        if not t:
            continue
        best = min(t, key=t.get)
        row.update(kdalab_ms=t[best], kdalab_config=best, all_configs=t)
        if chunk_kda is not None:
            row["fla_ms"] = bench(lambda: run_fla(chunk_kda, x, kw, cu))
            row["speedup"] = row["fla_ms"] / row["kdalab_ms"]
            if "default" in t:  # what a caller gets without choosing a configuration
                row["default_speedup"] = row["fla_ms"] / t["default"]
        nbytes = min_bytes(T_TOTAL, H, D, D)
        row["kdalab_GBps"] = nbytes / (row["kdalab_ms"] * 1e-3) / 1e9
        row["frac_of_copy_bw"] = row["kdalab_GBps"] * 1e9 / copy_bw
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


SPLIT_SHAPES = ((64, 128), (16, 512), (4, 2048), (1, 8192))  # (B, T): B·T = 8192 tokens


def split_study(H=64):
    """The two-stage forward against the one-pass ("fused") one, fixed length, B·T = 8192
    tokens from short to long sequences (random bf16 inputs; speed does not depend on them)."""
    rows = []
    configs = {"two_stage": KernelConfig(), "fused": KernelConfig(variant="fused")}
    for B, T in SPLIT_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(B)
        q, k, v, g = (torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16()
                      for _ in range(4))
        beta = torch.randn(B, T, H, device="cuda", generator=gen).bfloat16()
        a_log = torch.randn(H, device="cuda", generator=gen) * 0.5
        dt_bias = torch.randn(H * D, device="cuda", generator=gen) * 0.5
        row = dict(B=B, T=T, H=H)
        for name, cfg in configs.items():
            row[f"{name}_ms"] = bench(lambda cfg=cfg: chunk_kda_fwd(
                q, k, v, g, beta, A_log=a_log, dt_bias=dt_bias, lower_bound=LOWER_BOUND,
                config=cfg))
        row["fused_over_two_stage"] = row["fused_ms"] / row["two_stage_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def stage_times(configs):
    """Stage 1 and stage 2 alone (fixed length), to see where the time goes."""
    from kdalab.kernels.chunk_prepare import chunk_kda_prepare
    from kdalab.kernels.chunk_recurrent_t import chunk_kda_recurrent_t
    out = {}
    for H in (64, 96):
        x, kw, _ = inputs("model_like", H, False)
        q, k, v, g, beta = x
        nc = T_TOTAL // 16
        for name, config in configs.items():
            config = _resolve_dot(config, True)
            if config.variant != "t" or config.step != 16:
                continue
            bf16 = config.dot == "bf16"

            def s1(config=config, bf16=bf16):  # noqa: B023
                return chunk_kda_prepare(
                    q, k, g, beta, kw["A_log"], kw["dt_bias"], scale=D ** -0.5,
                    lower_bound=LOWER_BOUND, use_qk_l2norm=True, beta_is_logits=True,
                    cu_seqlens=None, chunk_table=None, num_chunks=nc,
                    operand_dtype=torch.bfloat16 if bf16 else torch.float16,
                    fp16_inverse=config.inverse == "fp16",
                    inv_precision="tf32x3" if config.inverse == "tf32x3" else "ieee",
                    num_warps=config.prepare_warps)
            ops = s1()

            def s2(config=config, bf16=bf16, ops=ops):
                return chunk_kda_recurrent_t(
                    v, *ops, initial_state=None, final_state=None, state_vk=False,
                    cu_seqlens=None, chunk_offsets=None, num_seqs=1, block_v=config.block_v,
                    num_warps=config.num_warps, num_stages=config.num_stages, dot=config.dot,
                    prefetch=config.prefetch, fp16_fallback=config.fp16_fallback)
            row = dict(H=H, config=name, stage1_ms=bench(s1), stage2_ms=bench(s2))
            row["stage2_us_per_step"] = 1e3 * row["stage2_ms"] / nc
            out[f"{H}/{name}"] = row
            print(json.dumps(row), flush=True)
    return out


def accuracy(chunk_kda, names, H=64):
    rows = []
    cases = [(f, False) for f in FAMILIES] + [("model_like", True), ("weak_decay_correlated", True)]
    for family, varlen in cases:
        x, kw, cu = inputs(family, H, varlen, seed=1)
        n = 1 if cu is None else len(VARLEN)
        h0 = torch.randn(n, H, D, D, device="cuda")
        ref_o, ref_s = reference_forward(*x, **kw, cu_seqlens=cu, initial_state=h0,
                                         output_final_state=True, lower_bound=LOWER_BOUND)
        row = dict(family=family, varlen=varlen, H=H, T=T_TOTAL)
        for name in names:
            cfg = ACCURACY_CONFIGS[name]
            o, s = run_kdalab(x, kw, cu, h0=h0, final=True, config=cfg)
            row[f"{name}_o"], row[f"{name}_S"] = rel_err(o, ref_o), rel_err(s, ref_s)
        if chunk_kda is not None:
            o, s = run_fla(chunk_kda, x, kw, cu, h0=h0, final=True)
            row["fla_o"], row["fla_S"] = rel_err(o, ref_o), rel_err(s, ref_s)
        row["ref_bf16_rounding"] = rel_err(ref_o.bfloat16(), ref_o)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="time several recurrent-stage configs")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--stages", action="store_true")
    ap.add_argument("--split", action="store_true",
                    help="two-stage vs one-pass forward from short to long sequences")
    ap.add_argument("--skip-speed", action="store_true",
                    help="no speed table (with --accuracy / --stages)")
    ap.add_argument("--shapes", default="64f,64v,96f,96v",
                    help="speed shapes: H and f(ixed)/v(arlen), e.g. 64f,96f")
    ap.add_argument("--stage-configs", default=",".join(STAGE_CONFIGS))
    ap.add_argument("--accuracy-configs", default=",".join(ACCURACY_CONFIGS))
    ap.add_argument("--configs", default=None,
                    help="comma-separated config names to time "
                         "(default: 'default', or all with --sweep)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    info = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    chunk_kda = _fla()
    if chunk_kda is not None:
        import fla
        info["fla"] = getattr(fla, "__version__", "?")
    print(json.dumps(info), flush=True)
    bw, copy_ms = copy_bandwidth()
    print(json.dumps(dict(copy_bandwidth_GBps=bw / 1e9, copy_ms=copy_ms)), flush=True)
    configs = {"default": KernelConfig()}
    if args.sweep or args.configs:
        configs.update(SWEEP)
    if args.configs:
        configs = {name: configs[name] for name in args.configs.split(",")}
    result = dict(info=info, copy_bandwidth_GBps=bw / 1e9)
    shapes = [(int(x[:-1]), x[-1] == "v") for x in args.shapes.split(",")]
    result["speed"] = [] if args.skip_speed else speed(chunk_kda, bw, configs, shapes)
    if args.accuracy:
        result["accuracy"] = accuracy(chunk_kda, args.accuracy_configs.split(","))
    if args.split:
        result["split"] = split_study()
    if args.stages:
        known = {"default": KernelConfig(), **SWEEP}
        result["stages"] = stage_times({n: known[n] for n in args.stage_configs.split(",")})
    print("\n H  varlen  kdalab_ms (config)       fla_ms  speedup  GB/s  of_copy_bw")
    for r in result["speed"]:
        print(f"{r['H']:3d}  {str(r['varlen']):6s}  {r['kdalab_ms']:.3f} ({r['kdalab_config']:11s})"
              f"  {r.get('fla_ms', float('nan')):7.3f}  {r.get('speedup', float('nan')):5.2f}x"
              f"  {r['kdalab_GBps']:5.0f}  {r['frac_of_copy_bw']:.2f}")
    for r in result["speed"]:
        if "default_speedup" in r:
            print(f"H={r['H']} varlen={r['varlen']}: default configuration "
                  f"{r['all_configs']['default']:.3f} ms, {r['default_speedup']:.2f}x fla")
    print("\n all configs (ms): " + ", ".join(f"H={r['H']} varlen={r['varlen']}: " + " ".join(
        f"{k}={v:.3f}" for k, v in r["all_configs"].items()) for r in result["speed"]))
    if args.accuracy:
        names = args.accuracy_configs.split(",") + ["fla"]
        heads = "  ".join(f"{n + ' o / S':>20s}" for n in names)
        print("\n family                 varlen  " + heads)
        for r in result["accuracy"]:
            cells = [f"{r.get(n + '_o', float('nan')):.2e} / {r.get(n + '_S', float('nan')):.2e}"
                     for n in names]
            row = "  ".join(f"{c:>20s}" for c in cells)
            print(f" {r['family']:22s} {str(r['varlen']):6s}  " + row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
