#!/usr/bin/env python3
"""Which summation order ``cublasGemmEx`` (COMPUTE_16F, one matrix per call: the seed's call)
runs per shape on this GPU, against candidate orders built from kdalab's Tensor-Core block
(run on a CUDA device; issue 23, part 5).

    PYTHONPATH=$PWD/src python3 benchmarks/cublas_shapes.py [--json PATH] [--raw PATH.npz] \\
        [--square 17-64] [--shapes 1x24x32,...] [--dense-only] [--candidates a,b]
    python benchmarks/cublas_shapes.py --stand-in slices8-tree ...   # the method, no GPU

Each product is one ``cublas_gemm_single`` call (operands in fresh allocations, as the seed's:
cuBLAS may choose by alignment); its fp16 result is compared bit for bit with the ``h200`` model
(``gemmex_16f``), the exact sum rounded once and every order of :mod:`kdalab.arith.orders`,
emulated by kdalab's torch code on the GPU (checked against the CPU per shape) or the CPU.
Operands (each row says which): ``neumann``, the products of the seed's Neumann inverse of
fp16(stable L) of model_like runs at C = n, the chain run with cuBLAS itself (at C = 64 also the
whole chains against the CPU model, with ``inv_stable_l_rel_rmse``); ``dense``, N(0, 1)·2^u with
u uniform in [-4, 2] per matrix; ``fwdsub``, the 1×k×64 products of ``forward_substitution``
(C = 64); ``sgemm``, the seed's fp32 L (``a.float() @ b.float().t()``, C×128×C) against
``h200-sgemm``. Prints the table (shape × candidate: fraction of equal outputs, matrices equal)
and the 100 % candidates per shape. ``--json``: docs/BENCHMARKS.md's shape, a row per shape;
``--raw``: operands and outputs where ``h200`` fails (and 64³), < 5 MB, for golden tests.
``--stand-in ORDER`` checks the method on the CPU: cuBLAS is replaced by one candidate order
(or ``h200``, the model), and every row must name it among its 100 % candidates
(tests/test_cublas_shapes.py runs it so).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from kdalab.arith import FP16, get_accumulation, rel_rmse, torch_cast  # noqa: E402
from kdalab.arith.linalg import inv64  # noqa: E402
from kdalab.arith.orders import ORDERS, ordered_gemm  # noqa: E402
from kdalab.arith.tensorcore import gemmex_16f  # noqa: E402
from kdalab.kda.inverse import neumann_factor_count  # noqa: E402
from kdalab.params import int_list  # noqa: E402

SQUARE = (16, 32, 48, 56, 64, 80, 96, 112, 128)
#: k of the 1×k×64 forward-substitution products compared (k ≤ 16 is one block: verified)
FWDSUB_K = (17, 24, 32, 40, 48, 56, 63)
SGEMM_CHUNKS = (48, 64)
LOWER_BOUNDS = (-2.0, -5.0, -10.0)
RAW_BYTES = 4_500_000  # --raw stays below 5 MB uncompressed
RAW_PER_SHAPE = 32


def candidates(m: int, k: int, n: int, only: tuple = ()) -> dict[str, Callable]:
    """Name → f(a, b) of every candidate at this shape (``only``: these and ``h200``): ``h200``
    (the model), ``fp16-once`` and the :data:`ORDERS` (an order equal to an earlier one at this
    k maps to the same function)."""
    out: dict[str, Callable] = {
        "h200": lambda a, b: gemmex_16f(a.double(), b.double()),
        "fp16-once": lambda a, b: get_accumulation("fp16-once").matmul(a.half(), b.half()),
    }
    seen: dict[tuple, Callable] = {}
    for order in ORDERS:
        key = order.key(k)
        if key not in seen:
            seen[key] = (lambda o: lambda a, b: ordered_gemm(a, b, o))(order)
        out[order.name] = seen[key]
    return {name: f for name, f in out.items() if not only or name == "h200" or name in only}


def same_bits(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same fp16/fp32 bits (any NaN equals any NaN)."""
    x, y = x.cpu(), y.cpu()
    iview = torch.int16 if x.dtype == torch.float16 else torch.int32
    nan = torch.isnan(x) & torch.isnan(y)
    return nan | (x.view(iview) == y.contiguous().view(iview))


def compare(a: torch.Tensor, b: torch.Tensor, device_out: torch.Tensor,
            cands: dict[str, Callable], emulate: str = "cpu", check: int = 2,
            cpu_max: int = 24) -> dict[str, dict]:
    """For each candidate: fraction of outputs and of matrices bit-identical to ``device_out``
    ([B, M, N]). ``emulate="cuda"`` runs the emulation on the GPU (same torch ops) and checks it
    against the CPU on the first ``check`` matrices; where that raises or differs, the candidate
    runs on the CPU on the first ``cpu_max`` matrices (``on`` says which). A candidate that
    raises on the CPU too is reported with its error: never fatal."""
    results: dict[str, dict] = {}
    cache: dict[int, dict] = {}
    for name, fn in cands.items():
        if id(fn) in cache:
            results[name] = cache[id(fn)]
            continue
        res = None
        if emulate != "cpu":
            try:
                got = fn(a.to(emulate), b.to(emulate)).cpu()
                if bool(same_bits(got[:check], fn(a[:check], b[:check])).all()):
                    res = _fractions(same_bits(got, device_out), emulate)
            except Exception:  # the CPU below decides
                res = None
        if res is None:
            try:
                n = a.shape[0] if emulate == "cpu" else min(cpu_max, a.shape[0])
                res = _fractions(same_bits(fn(a[:n], b[:n]), device_out[:n]), "cpu")
            except Exception as exc:  # a candidate's failure is a result, not a crash
                res = {"error": f"{type(exc).__name__}: {exc}"}
        cache[id(fn)] = results[name] = res
    return results


def _fractions(eq: torch.Tensor, on: str) -> dict:
    return {"elements": float(eq.float().mean()), "matrices": int(eq.flatten(1).all(1).sum()),
            "of": int(eq.shape[0]), "on": on}


def exact_matches(results: dict[str, dict]) -> list[str]:
    return [name for name, r in results.items() if r.get("elements") == 1.0]


class Recorder:
    """An accumulation model for kdalab's Neumann / forward substitution that runs every product
    through ``gemm`` (one call per matrix) and keeps operands and outputs per shape."""

    name = "recorder"
    out_dtype = torch.float16
    needs_cuda = False
    gpu_twin = None
    fp32_companion = None

    def __init__(self, gemm: Callable) -> None:
        self.gemm = gemm
        self.products: dict[tuple, list] = {}

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a3 = a.expand(lead + a.shape[-2:]).reshape((-1,) + a.shape[-2:])
        b3 = b.expand(lead + b.shape[-2:]).reshape((-1,) + b.shape[-2:])
        # fresh allocations, as the seed's operands: cuBLAS may choose its kernel by alignment
        out = torch.stack([self.gemm(a3[i].clone(), b3[i].clone()) for i in range(a3.shape[0])])
        shape = (a3.shape[1], a3.shape[2], b3.shape[2])
        self.products.setdefault(shape, []).append((a3.cpu(), b3.cpu(), out.cpu()))
        return out.reshape(lead + out.shape[-2:])

    def stacked(self, shape: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        got = self.products[shape]
        return tuple(torch.cat([g[i] for g in got]) for i in range(3))


def study_runs(chunk: int, runs: int):
    from kdalab.inputs.runs import Run

    per = -(-runs // len(LOWER_BOUNDS))
    return [Run("model_like", lb, chunk, s, 128) for lb in LOWER_BOUNDS for s in range(per)][:runs]


def stable_l_fp16(chunk: int, runs: int):
    """fp16(stable L) of model_like runs (the seed's ``l_ref.half()``) and stable L itself."""
    from kdalab.inputs.draw import make_inputs_batch
    from kdalab.kda.intra import stable_l

    inp = make_inputs_batch(study_runs(chunk, runs), "cpu")
    l_ref = stable_l(inp.keys, inp.log_decay, inp.beta)
    return torch_cast(l_ref, FP16).half(), l_ref


def neumann_source(chunk: int, runs: int, gemm: Callable, device: str, chain: dict | None = None):
    """The Neumann products on ``device`` through ``gemm``; with ``chain``, also the whole
    chain against the CPU ``h200`` model (runs that differ, inv_stable_l_rel_rmse)."""
    from kdalab.kda.inverse import neumann_inverse

    l16, l_ref = stable_l_fp16(chunk, runs)
    rec = Recorder(gemm)
    inv_dev = neumann_inverse(l16.to(device), rec, FP16).inverse.cpu()
    if chain is not None:
        inv_cpu = neumann_inverse(l16, "h200", FP16).inverse
        eq = same_bits(inv_dev, inv_cpu).flatten(1).all(1)
        inv_ref = inv64(torch.eye(chunk, dtype=torch.float64) + l_ref)
        d = (rel_rmse(inv_dev, inv_ref) - rel_rmse(inv_cpu, inv_ref)).abs()
        chain.update(runs=len(eq), differ=int((~eq).sum()), max_metric_diff=float(d.max()))
    return rec


def fwdsub_source(chunk: int, runs: int, gemm: Callable, device: str) -> Recorder:
    from kdalab.kda.inverse import forward_substitution

    l16, _ = stable_l_fp16(chunk, runs)
    rec = Recorder(gemm)
    forward_substitution(l16.to(device), rec, FP16)
    return rec


def dense_operands(m: int, k: int, n: int, count: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.empty(count, 1, 1).uniform_(-4, 2, generator=g))
    a = (torch.randn(count, m, k, generator=g, dtype=torch.float64) * scale).half()
    b = (torch.randn(count, k, n, generator=g, dtype=torch.float64) * scale).half()
    return a, b


def run_on(gemm: Callable, a: torch.Tensor, b: torch.Tensor, device: str) -> torch.Tensor:
    return torch.stack([gemm(a[i].to(device).clone(), b[i].to(device).clone()).cpu()
                        for i in range(a.shape[0])])


def measure(gemm: Callable, device: str, *, matrices: int = 200, runs: int = 42,
            emulate: str = "cpu", dense: bool = True, neumann_rows: bool = True,
            square: tuple = SQUARE, shapes: tuple = (), fwdsub_k: tuple = FWDSUB_K,
            sgemm_chunks: tuple = (), sgemm: Callable | None = None, only: tuple = (),
            budget_s: float | None = None, log=print) -> dict:
    """Every comparison; returns {"rows": [...], "chain": {...}, "raw": {...}}. ``gemm(a, b)``:
    one fp16 product of two 2-D tensors on ``device`` (cuBLAS on the GPU; a mock in tests).
    ``shapes``: more (m, k, n) with dense operands; ``only``: the candidates to compare."""
    rows: list[dict] = []
    raw: dict[str, tuple] = {}
    chain: dict = {}
    t0 = time.perf_counter()

    def record(source: str, shape: tuple, a, b, out, cands=None):
        label = "x".join(map(str, shape))
        t = time.perf_counter()
        try:
            res = compare(a, b, out, cands or candidates(*shape, only), emulate)
        except Exception:
            log(f"  {label} {source}: FAILED\n{traceback.format_exc()}")
            rows.append({"shape": label, "source": source, "error": traceback.format_exc(-1)})
            return
        row = {"shape": label, "source": source, "matrices": int(a.shape[0]), "results": res,
               "exact": exact_matches(res)}
        rows.append(row)
        model = next(iter(res))
        h = res[model]
        log(f"  {label:>12} {source:8} {a.shape[0]:4d} matrices  {model} "
            f"{h.get('elements', float('nan')):.6f} ({h.get('matrices', '?')}/{a.shape[0]})  "
            f"100%: {', '.join(row['exact']) or 'none'}  [{time.perf_counter() - t:.1f} s, "
            f"total {time.perf_counter() - t0:.1f} s]")
        if h.get("elements") != 1.0 or shape == (64, 64, 64):
            raw[f"{source}_{label}"] = (a, b, out)

    def neumann(n: int):
        per_run = 2 * (neumann_factor_count(n) - 1)  # products of one run's chain
        count = runs if n == 64 else -(-matrices // per_run)
        rec = neumann_source(n, count, gemm, device, chain if n == 64 else None)
        a, b, out = rec.stacked((n, n, n))
        keep = a.shape[0] if n == 64 else matrices
        record("neumann", (n, n, n), a[:keep], b[:keep], out[:keep])
        if n == 64:
            log(f"  chain at C = 64: {chain['differ']} of {chain['runs']} runs' inverses "
                f"differ from the CPU h200 model; max |Δ inv_stable_l_rel_rmse| "
                f"{chain['max_metric_diff']:.3g}")

    def dense_rows(shape: tuple):
        a, b = dense_operands(*shape, matrices, seed=hash(shape) % 2**31)
        record("dense", shape, a, b, run_on(gemm, a, b, device))

    def fwdsub():
        rec = fwdsub_source(64, runs, gemm, device)
        for k in fwdsub_k:
            record("fwdsub", (1, k, 64), *rec.stacked((1, k, 64)))

    # the size first, so that a run out of time still has it
    order = sorted(square, key=lambda n: (n != 64, n))
    tasks = []
    for i, n in enumerate(order):
        tasks += [(f"neumann {n}", lambda n=n: neumann(n))] if neumann_rows else []
        tasks += [(f"dense {n}", lambda n=n: dense_rows((n, n, n)))] if dense else []
        if i == 0:
            tasks += [("fwdsub", fwdsub)] if fwdsub_k else []
            tasks += [(f"sgemm {c}", lambda c=c: _sgemm_rows(c, runs, sgemm, device, record))
                      for c in sgemm_chunks]
    tasks += [("x".join(map(str, sh)), lambda sh=sh: dense_rows(sh)) for sh in shapes]
    for what, fn in tasks:
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            log(f"  {what}: skipped (time budget of {budget_s:.0f} s spent)")
            rows.append({"shape": what, "source": what, "error": "skipped: time budget"})
            continue
        try:
            fn()
        except Exception:  # one shape's failure is reported, the others still run
            log(f"  {what}: FAILED\n{traceback.format_exc()}")
            rows.append({"shape": what, "source": what, "error": traceback.format_exc(-1)})
    return {"rows": rows, "chain": chain, "raw": raw}


def _sgemm_rows(chunk: int, runs: int, sgemm: Callable, device: str, record) -> None:
    """The fp32 GEMM of the seed's L: its operands from kdalab's kernel_l (the seed recipe)."""
    from kdalab.inputs.draw import make_inputs_batch
    from kdalab.kda.intra import kernel_l
    from kdalab.kda.recipe import SEED

    class Keep:
        name, out_dtype, needs_cuda, gpu_twin, fp32_companion = "keep", torch.float32, False, \
            None, None

        def matmul(self, a, b):
            self.a, self.b = a, b
            return get_accumulation("h200-sgemm").matmul(a, b)

    keep = Keep()
    inp = make_inputs_batch(study_runs(chunk, runs), "cpu")
    kernel_l(inp.keys, inp.log_decay, inp.beta, SEED.with_(l_accumulation=keep))
    a, b = keep.a.float(), keep.b.float()  # b is k_inverse.T, as the seed's .t()
    # fresh [C, D] operands, the second transposed as a view: the seed's a @ b.t()
    out = torch.stack([sgemm(a[i].contiguous().to(device),
                             b[i].transpose(0, 1).contiguous().to(device).t()).cpu()
                       for i in range(a.shape[0])])
    cands = {"h200-sgemm": lambda x, y: get_accumulation("h200-sgemm").matmul(x, y)}
    record("sgemm", (chunk, a.shape[-1], chunk), a, b, out, cands)


def table(rows: list[dict]) -> str:
    """Shape × candidate: fraction of identical outputs (matrices identical / of)."""
    names: list[str] = []
    for r in rows:
        for name in r.get("results", {}):
            if name not in names:
                names.append(name)
    lines = []
    for r in rows:
        head = f"{r['shape']} {r['source']}"
        if "error" in r:
            lines.append(f"{head}: error {r['error'].strip().splitlines()[-1]}")
            continue
        lines.append(f"{head} ({r['matrices']} matrices); 100 %: {', '.join(r['exact']) or 'NONE'}")
        for name in names:
            res = r["results"].get(name)
            if res is None:
                continue
            if "error" in res:
                lines.append(f"    {name:22} error {res['error']}")
            else:
                where = "  (CPU)" if res.get("on") == "cpu" and res["of"] < r["matrices"] else ""
                lines.append(f"    {name:22} {res['elements']:.6f}  {res['matrices']}/{res['of']}"
                             f"{where}")
    return "\n".join(lines)


def json_rows(result: dict) -> list[dict]:
    """docs/BENCHMARKS.md rows: per shape the h200 model's fraction, the 100 % candidates."""
    out = []
    for r in result["rows"]:
        if "error" in r:
            what = r["shape"] if r["shape"] == r["source"] else f"{r['shape']} {r['source']}"
            out.append({"target": what, "value": 0, "unit": "error",
                        "note": r["error"].strip().splitlines()[-1][:200]})
            continue
        model = "h200-sgemm" if r["source"] == "sgemm" else "h200"
        res = r["results"].get(model, {})
        out.append({"target": f"cublasGemmEx {r['shape']} ({r['source']}): {model} model",
                    "value": res.get("elements", 0.0), "unit": "fraction of outputs equal",
                    "note": f"{res.get('matrices', 0)}/{r['matrices']} matrices equal; 100 %: "
                            f"{', '.join(r['exact']) or 'none'}"})
    chain = result.get("chain")
    if chain:
        out.append({"target": "Neumann chain C = 64 (model_like): runs differing from h200",
                    "value": chain["differ"], "unit": f"of {chain['runs']} runs",
                    "note": f"max |Δ inv_stable_l_rel_rmse| {chain['max_metric_diff']:.3g}"})
    return out


def write_raw(path: str, result: dict) -> int:
    """The operands and device outputs of the failing shapes (and 64³), within RAW_BYTES."""
    arrays: dict[str, np.ndarray] = {"table_json": np.array(json.dumps(result["rows"]))}
    used = 0
    for key, (a, b, out) in sorted(result["raw"].items(), key=lambda kv: kv[1][0][0].numel()):
        count = min(RAW_PER_SHAPE, a.shape[0])
        size = count * (a[0].numel() * a.element_size() + b[0].numel() * b.element_size()
                        + out[0].numel() * out.element_size())
        if used + size > RAW_BYTES:
            count = int(count * (RAW_BYTES - used) / size)
            if count < 1:
                continue
            size = size * count // min(RAW_PER_SHAPE, a.shape[0])
        used += size
        for name, t in (("a", a), ("b", b), ("out", out)):
            arrays[f"{key}_{name}"] = t[:count].numpy()
    np.savez_compressed(path, **arrays)
    return used


def _stand_in(name: str) -> Callable:
    """One fp16 product of two 2-D CPU tensors by the candidate ``name``: cuBLAS's stand-in."""
    if name == "h200":
        return lambda a, b: gemmex_16f(a[None].double(), b[None].double())[0]
    order = next(o for o in ORDERS if o.name == name)
    return lambda a, b: ordered_gemm(a[None], b[None], order)[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write docs/BENCHMARKS.md's JSON here")
    p.add_argument("--raw", help="write operands and cuBLAS outputs (.npz) here")
    p.add_argument("--matrices", type=int, default=200, help="matrices per shape")
    p.add_argument("--runs", type=int, default=42, help="model_like runs at C = 64")
    p.add_argument("--square", default=",".join(map(str, SQUARE)),
                   help="square sizes n (list grammar: 17-64,80)")
    p.add_argument("--shapes", default="", help="more shapes MxKxN, comma-separated (dense)")
    p.add_argument("--dense-only", action="store_true",
                   help="dense operands only: no Neumann, forward-substitution or fp32 rows")
    p.add_argument("--candidates", default="", help="compare only these (and h200)")
    p.add_argument("--budget-s", type=float, default=45.0,
                   help="start no shape after this many seconds (the rest are reported skipped)")
    p.add_argument("--emulate", choices=("cuda", "cpu"), default="cuda",
                   help="where the candidates' emulation runs (cuda: checked against the CPU "
                        "on 2 matrices per shape and candidate, the CPU taking over on a "
                        "mismatch)")
    p.add_argument("--fwdsub-k", default=",".join(map(str, FWDSUB_K)),
                   help="k of the 1×k×64 forward-substitution products ('' for none)")
    p.add_argument("--stand-in", choices=("h200", *(o.name for o in ORDERS)), default=None,
                   help="no GPU: cuBLAS replaced by this candidate on the CPU (no fp32 rows)")
    args = p.parse_args(argv)
    fwdsub_k = () if args.dense_only or not args.fwdsub_k else tuple(
        int_list(args.fwdsub_k, "--fwdsub-k", 1))
    if args.stand_in:
        gemm, device, emulate, sgemm_chunks = _stand_in(args.stand_in), "cpu", "cpu", ()
        device_name = f"CPU, cuBLAS replaced by {args.stand_in}"
    elif not torch.cuda.is_available():
        print("error: cublas_shapes needs a CUDA device (or --stand-in)", file=sys.stderr)
        return 2
    else:
        from kdalab.arith.gpu.cublas import cublas_gemm_single, cublas_version

        torch.backends.cuda.matmul.allow_tf32 = False
        gemm, device, emulate = cublas_gemm_single, "cuda", args.emulate
        sgemm_chunks = () if args.dense_only else SGEMM_CHUNKS
        device_name = f"{torch.cuda.get_device_name(0)}, cuBLAS {cublas_version()}"
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"{device_name}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads",
          flush=True)

    def sgemm(a, b):  # the seed's per-run fp32 product, b a transposed view as its .t()
        return torch.matmul(a, b)

    shapes = tuple(tuple(int(x) for x in sh.split("x")) for sh in args.shapes.split(",") if sh)
    result = measure(gemm, device, matrices=args.matrices, runs=args.runs,
                     emulate=emulate, budget_s=args.budget_s,
                     square=int_list(args.square, "--square", 1), shapes=shapes,
                     neumann_rows=not args.dense_only, fwdsub_k=fwdsub_k,
                     sgemm_chunks=sgemm_chunks, sgemm=sgemm,
                     only=tuple(c for c in args.candidates.split(",") if c),
                     log=lambda s: print(s, flush=True))
    print("\n" + table(result["rows"]))
    print("\nper shape, the candidates that match 100 %:")
    for r in result["rows"]:
        print(f"  {r['shape']:>12} {r['source']:8} {', '.join(r.get('exact', [])) or 'NONE'}")
    if args.json:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, cwd=os.path.dirname(__file__)).stdout.strip()
        except OSError:  # no git on the device
            commit = ""
        doc = {"benchmark": "cublas_shapes", "device": device_name,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
               "command": "python3 benchmarks/cublas_shapes.py " + " ".join(sys.argv[1:]),
               "rows": json_rows(result)}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    if args.raw:
        print(f"wrote {args.raw} ({write_raw(args.raw, result)} bytes before compression)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
