"""The CPU side of scripts/device/flashkda_golden.py (case draws, calls, packing, the reader),
run against stand-ins for FlashKDA's package and its torch reference (kdalab's flashkda recipe):
the device run itself needs the H200 and FlashKDA's build."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.flashkda_data import load_golden

SCRIPT = Path(__file__).parents[1] / "scripts" / "device" / "flashkda_golden.py"

FAKE_FLASH_KDA = textwrap.dedent('''
    from kdalab.kda import forward

    CALLS = []

    def get_workspace_size(T_total, H, N=1):
        tiles = (T_total + 15) // 16 + N
        return H * tiles * (3 * 16 * 128 * 2 + 128 * 4 + 2 * 16 * 16 * 2) + 128

    def fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
            final_state=None, cu_seqlens=None):
        CALLS.append((tuple(q.shape), None if cu_seqlens is None else cu_seqlens.tolist()))
        o, s = forward(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias,
                       lower_bound=lower_bound, initial_state=initial_state,
                       output_final_state=True, cu_seqlens=cu_seqlens, recipe="flashkda",
                       state_layout="VK")
        out.copy_(o)
        final_state.copy_(s.to(final_state.dtype))

    def _fwd_raw(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound,
                 initial_state=None, final_state=None, cu_seqlens=None):
        fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state,
            final_state, cu_seqlens)
''')


@pytest.fixture()
def script(tmp_path, monkeypatch):
    (tmp_path / "tests").mkdir()
    (tmp_path / "flash_kda.py").write_text(FAKE_FLASH_KDA)
    (tmp_path / "tests" / "torch_ref.py").write_text(
        "from flash_kda import fwd as torch_ref  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FLASHKDA_SRC", str(tmp_path))
    for name in ("flash_kda", "torch_ref"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    spec = importlib.util.spec_from_file_location("flashkda_golden", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "flashkda_golden", mod)  # dataclasses look it up
    spec.loader.exec_module(mod)
    yield mod
    for name in ("flash_kda", "torch_ref"):
        sys.modules.pop(name, None)


def test_dry_run_writes_cases_the_reader_reads(script, tmp_path):
    out = tmp_path / "out"
    names = ["model_T1", "model_B2_T17_fp32s", "weak_varlen_short_bf16s"]  # script's order
    assert script.main(["--device", "cpu", "--out", str(out), "--cases", ",".join(names)]) == 0
    facts, cases = load_golden(out / "flashkda_golden.npz")
    assert [c.name for c in cases] == names
    assert facts["device"] == "cpu" and facts["dim"] == 128 and facts["chunk"] == 16
    by = {c.name: c for c in cases}
    var = by["weak_varlen_short_bf16s"]
    assert var["cu_seqlens"].tolist() == [0, 2, 3, 18, 34, 51]
    assert var["q"].shape == (1, 51, 1, 128) and var["q"].dtype == torch.bfloat16
    assert var["beta"].shape == (1, 51, 1) and var["A_log"].dtype == torch.float32
    assert var["initial_state"].shape == (5, 1, 128, 128)
    assert var["initial_state"].dtype == torch.bfloat16
    assert var["final_kernel"].dtype == torch.bfloat16
    fp32 = by["model_B2_T17_fp32s"]
    assert fp32["initial_state"].dtype == torch.float32
    assert fp32["final_kernel"].dtype == torch.float32 and fp32["q"].shape == (2, 17, 2, 128)
    assert by["model_T1"].get("initial_state") is None
    for c in cases:  # the stand-ins are one function: the packing must not change a bit
        assert torch.equal(c["out_kernel"].view(torch.int16), c["out_ref"].view(torch.int16))
        assert c.meta["kernel_deterministic"] and c.meta["raw_entry_same"]
        assert c.meta["kernel_vs_ref_output"]["bits_equal"] == 1.0
    # the inputs are the script's seeded draws, bit for bit
    again = script.draw(next(c for c in script.CASES if c.name == var.name))
    assert torch.equal(again["q"].view(torch.int16), var["q"].view(torch.int16))
    assert torch.equal(again["initial_state"].view(torch.int16),
                       var["initial_state"].view(torch.int16))


def test_bad_arguments(script, tmp_path):
    assert script.main(["--device", "cpu", "--out", str(tmp_path), "--cases", "nope"]) == 2


def test_workspace_tiles_follow_flashkda_indexing(script):
    var = script.Case("v", "model_like", -5.0, 2, lengths=(1, 17, 40))
    assert script.tile_index(var) == [0, 1, 2, 3, 4, 5]
    assert script.total_tiles(var) == (58 + 15) // 16 + 3
    fixed = script.Case("f", "model_like", -5.0, 2, batch=2, length=17)
    assert script.tile_index(fixed) == [0, 1, 2, 3] and script.total_tiles(fixed) == 4
    # a workspace whose tiles hold their own number comes back in sequence order
    nt, h = script.total_tiles(var), var.heads
    per = [3 * 16 * 128 * 2, 128 * 4, 2 * 16 * 16 * 2]
    ws = torch.zeros(h * nt * sum(per), dtype=torch.uint8)
    kd = torch.arange(h * nt, dtype=torch.float32).repeat_interleave(16 * 128).bfloat16()
    ws[: h * nt * 16 * 128 * 2] = kd.view(torch.uint8)
    parts = script.split_workspace(ws, var)
    assert parts["kd"].shape == (2, 6, 16, 128) and parts["gt"].shape == (2, 6, 128)
    assert parts["kd"][1, 5, 0, 0].item() == nt + 5


def test_agreement_counts_bits(script):
    a = torch.tensor([1.0, 2.0, 3.0, 4.0]).bfloat16()
    b = a.clone()
    b.view(torch.int16)[0] ^= 1  # one bit of 64
    r = script.agreement(a, b)
    assert r["elements_equal"] == 0.75
    assert r["bits_equal"] == pytest.approx(1 - 1 / 64)
    assert np.isclose(r["max_abs_diff_rel_to_max"], 2.0 ** -7 / 4)


class CpuInstr:
    """The script's instruction interface with correctly rounded stand-ins, on the CPU."""

    device = torch.device("cpu")

    def __init__(self, script):
        self.s = script

    def values(self, which, x):
        s, x = self.s, x.float()
        if which == s.TANH:
            return torch.tanh(x)
        if which == s.EX2:
            y = torch.exp2(x.double()).float()
            return torch.where(y < 2.0**-126, torch.zeros_like(y), y)
        if which in (s.RSQRT, s.RSQRTF):
            return torch.rsqrt(x.double()).float()
        if which == s.SIGMOID:
            return (torch.tanh(x * 0.5).double() * 0.5 + 0.5).float()
        if which == s.EXPF:
            return torch.exp(x)
        if which == s.EXPF_MODEL:
            return torch.exp2(x * torch.tensor(1.4426950408889634, dtype=torch.float32))
        raise AssertionError(which)

    def by_bits(self, which, start, n, step=1):
        b = torch.arange(n, dtype=torch.int64) * step + start
        return self.values(which, ((b + 2**31) % 2**32 - 2**31).to(torch.int32)
                           .view(torch.float32))


def test_instruction_captures_run_on_stand_ins(script, monkeypatch):
    """The CUDA-only parts (gate inputs, sweeps) with correctly rounded functions on a few
    values per binade: shapes, keys, and the structure tests saying 'exact' where they must."""
    monkeypatch.setattr(script, "BINADE", 1 << 9)
    ins = CpuInstr(script)
    case = script.Case("v", "model_like", -5.0, 2, lengths=(1, 17, 20))
    inputs = script.draw(case)
    gi = script.gate_inputs(case, inputs, ins)
    assert gi["sigmoid_in"].shape == (38, 2, 128) and gi["g_cumsum"].shape == (5, 16, 2, 128)
    assert torch.equal(gi["ex2_total"], gi["ex2_pos"][:, -1])  # the tail rows add zero
    assert torch.equal(gi["g_cumsum"][0, 1:], gi["g_cumsum"][0, :1].expand(15, 2, 128))
    want = inputs["k"].float().square().sum(-1) + 1e-6
    assert torch.allclose(gi["rsqrt_in"][1], want.reshape(38, 2), rtol=1e-5)
    tanh = script.sweep_tanh(ins)
    assert tanh["summary"]["binades"][0]["odd"]
    assert tanh["arrays"]["bf16_sigmoid"].shape == (65536,)
    ex2 = script.sweep_ex2(ins)
    assert ex2["summary"]["frac_ulp_range"] == (0, 0)
    assert ex2["summary"]["binades"]["+3"]["floor"] == 0
    assert ex2["summary"]["binades"]["-3"]["floor"] == 0
    rs = script.sweep_rsqrt(ins)
    assert set(rs["summary"]["binades"].values()) == {0}  # 1/√(4x) = (1/√x)/2 exactly


def test_dry_run_with_instructions_packs_every_file(script, tmp_path, monkeypatch):
    monkeypatch.setattr(script, "BINADE", 1 << 8)
    out = tmp_path / "out"
    assert script.main(["--device", "cpu", "--out", str(out), "--cases", "model_T1"],
                       ins=CpuInstr(script)) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "flashkda_golden.npz", "flashkda_sfu_ex2_rsqrt.npz",
        "flashkda_sfu_tanh.npz", "flashkda_stage1.npz"]
    with np.load(out / "flashkda_stage1.npz") as z:
        assert "ws__c00__kd" in z.files and "in__c00__sigmoid_out" in z.files
    with np.load(out / "flashkda_sfu_ex2_rsqrt.npz") as z:
        assert {"ex2__frac_ulp", "rsqrt__e0_ulp", "ex2__summary_json"} <= set(z.files)
    # the tables as package data: only what the models read
    spec = importlib.util.spec_from_file_location("sm90_tables", SCRIPT.parents[1] /
                                                  "sm90_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    dest, checks = tmp_path / "data", tmp_path / "checks.npz"
    assert tables.main([str(out), "--dest", str(dest), "--checks", str(checks)]) == 0
    with np.load(dest / "sm90_tanh.npz") as z:
        assert {"summary_json", "d0", "b0"} <= set(z.files)
        assert not any(k.startswith(("s", "w", "bf")) for k in z.files if k != "summary_json")
    with np.load(checks) as z:
        assert sorted(z.files) == ["bf16_in", "bf16_sigmoid", "bf16_tanh", "ex2_edge_in",
                                   "ex2_edge_out"]
    only = tmp_path / "only"
    assert script.main(["--device", "cpu", "--out", str(only), "--only-sweeps"],
                       ins=CpuInstr(script)) == 0
    assert sorted(p.name for p in only.iterdir()) == ["flashkda_sfu_ex2_rsqrt.npz",
                                                       "flashkda_sfu_tanh.npz"]
    with np.load(dest / "sm90_ex2_rsqrt.npz") as z:
        assert "ex2__edge_in" not in z.files and "rsqrt__e1_ulp" in z.files


#: A stand-in for FlashKDA v2's torch reference (its interface only: ``torch_ref`` fills ``out``
#: and ``final_state`` and calls the module's ``inv_fwd_subst_16`` once per chunk and head).
FAKE_V2_REF = textwrap.dedent('''
    import torch
    from kdalab.kda import forward

    def inv_fwd_subst_16(L):
        return (torch.eye(16) + L).bfloat16()

    def torch_ref(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None,
                  final_state=None, cu_seqlens=None):
        t, h = q.shape[1], q.shape[2]
        lens = [t] * q.shape[0] if cu_seqlens is None else cu_seqlens.diff().tolist()
        for n in lens:
            for _ in range((n + 15) // 16):
                for _ in range(h):
                    inv_fwd_subst_16(torch.full((16, 16), float(n)).tril(-1))
        o, s = forward(q, k, v, g, beta, scale=scale, A_log=A_log, dt_bias=dt_bias,
                       lower_bound=lower_bound, initial_state=initial_state,
                       output_final_state=True, cu_seqlens=cu_seqlens, recipe="flashkda",
                       state_layout="VK")
        out.copy_(o)
        final_state.copy_(s.to(final_state.dtype))
''')


def test_v2_dry_run_packs_outputs_and_every_inverse(script, tmp_path, monkeypatch):
    ref = tmp_path / "v2_ref.py"
    ref.write_text(FAKE_V2_REF)
    monkeypatch.setenv("FLASHKDA_V2_REF", str(ref))
    out = tmp_path / "out"
    names = ["v2_weak_varlen_bf16s", "v2_collinear0_lb2_B2_T64_fp32s"]  # the script's order
    assert script.main(["--v2", "--device", "cpu", "--out", str(out), "--cases",
                        ",".join(names)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["flashkda_v2_golden.npz"]
    facts, cases = load_golden(out / "flashkda_v2_golden.npz")
    assert [c.name for c in cases] == names and facts["inverse_order"] == "sequence, chunk, head"
    var, col = cases
    # one inverse per chunk and head, in the reference's order (the stand-in's L holds the
    # sequence's length)
    lens = [2, 1, 15, 16, 17, 33]
    want = [n for n in lens for _ in range((n + 15) // 16)]
    assert var["inv_L"].dtype == torch.float32 and var["inv"].dtype == torch.bfloat16
    assert var["inv_L"][:, 1, 0].tolist() == want and var.meta["inverses"] == len(want)
    assert col["inv"].shape == (2 * 4, 16, 16)
    assert var["final_ref"].dtype == torch.bfloat16 and col["final_ref"].dtype == torch.float32
    assert var["out_ref"].shape == (1, 84, 1, 128) and col["out_ref"].shape == (2, 64, 1, 128)
    # the collinear family: one key per head (eps = 0), β logits ≈ 10, raw gate −10, no A_log
    assert torch.equal(col["k"][0, 1:], col["k"][:1, :1].expand(2, 63, 1, 128)[0])
    assert (col["g"].float() == -10).all() and (col["A_log"] == 0).all()
    assert (col["dt_bias"] == 0).all() and (col["beta"].float() > 8).all()
    spec = next(c for c in script.V2_CASES if c.name == col.name)
    assert torch.equal(script.draw(spec)["k"].view(torch.int16), col["k"].view(torch.int16))
    assert script.main(["--v2", "--device", "cpu", "--out", str(out), "--cases", "model_T1"]) == 2
    monkeypatch.setenv("FLASHKDA_V2_REF", str(tmp_path / "missing.py"))
    with pytest.raises(SystemExit):
        script.main(["--v2", "--device", "cpu", "--out", str(out)])


def test_v2_cases_are_distinct_and_small(script):
    names = [c.name for c in script.V2_CASES]
    assert len(set(names)) == len(names) and not set(names) & {c.name for c in script.CASES}
    assert {c.eps for c in script.V2_CASES if c.family == "collinear"} == {0.0, 0.01, 0.05}
    assert max(c.total for c in script.V2_CASES) <= 1024
