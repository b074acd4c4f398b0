"""Capture a model's KDA inputs and replay them with ``kdalab check --inputs``: the runnable
example of docs/check.md (a small randomly initialised KDA layer), and the file format."""

from __future__ import annotations

import pytest
import torch

import kdalab.kda as kda
from kdalab.check.capture import capture
from kdalab.check.records import read
from kdalab.check.replay import read_inputs, replay_cases, write_inputs
from tests.test_check import MOD, runner


class TinyKDA(torch.nn.Module):
    """A KDA layer with random weights: projections to q, k, v, the gate input and β logits,
    then ``kdalab.kda.forward`` looked up at call time (what ``capture`` wraps)."""

    def __init__(self, d: int = 48, heads: int = 2, head_dim: int = 16, lower_bound=-5.0):
        super().__init__()
        self.h, self.dk, self.lower_bound = heads, head_dim, lower_bound
        self.proj = torch.nn.ModuleDict({n: torch.nn.Linear(d, heads * head_dim, bias=False)
                                         for n in ("q", "k", "v", "g")})
        self.b = torch.nn.Linear(d, heads, bias=False)
        self.out = torch.nn.Linear(heads * head_dim, d, bias=False)
        self.A_log = torch.nn.Parameter(torch.rand(heads))
        self.dt_bias = torch.nn.Parameter(torch.rand(heads, head_dim))

    def forward(self, x, state=None):
        b, t, _ = x.shape
        q, k, v, g = (self.proj[n](x).view(b, t, self.h, self.dk).bfloat16() for n in "qkvg")
        o, state = kda.forward(q, k, v, g, self.b(x).bfloat16(), A_log=self.A_log.float(),
                               dt_bias=self.dt_bias.float(), lower_bound=self.lower_bound,
                               initial_state=state, output_final_state=True, recipe="fp32")
        return self.out(o.float().reshape(b, t, -1)), state


def test_capture_a_layer_and_replay_it(tmp_path):
    torch.manual_seed(0)
    layer = TinyKDA()
    x = torch.randn(1, 40, 48)
    with torch.no_grad(), capture("kdalab.kda:forward", tmp_path / "cap", limit=2) as cap:
        y, state = layer(x[:, :24])                # a prompt
        y2, _ = layer(x[:, 24:], state=state)      # its continuation, from the carried state
        layer(x)                                   # a third call: over the limit, not written
    assert kda.forward.__name__ == "forward"  # restored after the block
    assert [p.name for p in cap.paths] == ["call_0000.safetensors", "call_0001.safetensors"]
    assert cap.calls == 3 and cap.skipped == {}
    second = read_inputs(cap.paths[1])
    assert second.initial_state is not None and second.lower_bound == -5.0
    assert torch.equal(second.initial_state, state)
    assert [c.name for c in replay_cases(tmp_path / "cap")] == ["inputs/call_0000",
                                                                 "inputs/call_0001"]

    def check(kernel, out):
        return runner.invoke(None, ["check", f"{MOD}:{kernel}", "--device", "cpu",
                                    "--inputs", str(tmp_path / "cap"), "--out", str(out)])

    honest = check("honest_fp32", tmp_path / "a")
    assert honest.exit_code == 0, honest.output
    assert {r["status"] for r in read(tmp_path / "a")} == {"pass"}
    dropped = check("drops_initial_state", tmp_path / "b")
    assert dropped.exit_code == 1, dropped.output
    status = {r["case"]: r["status"] for r in read(tmp_path / "b")}
    assert status == {"inputs/call_0000": "pass", "inputs/call_0001": "fail"}


def test_a_file_written_by_hand_with_varlen_and_state(tmp_path):
    gen = torch.Generator().manual_seed(1)

    def r(*shape):
        return torch.randn(*shape, generator=gen)

    h, kd = 2, 16
    tensors = dict(q=r(1, 30, h, kd).bfloat16(), k=r(1, 30, h, kd).bfloat16(),
                   v=r(1, 30, h, kd).bfloat16(), g=r(1, 30, h, kd).bfloat16(),
                   beta=r(1, 30, h).bfloat16(), A_log=torch.rand(h, generator=gen),
                   dt_bias=torch.rand(h * kd, generator=gen), initial_state=r(2, h, kd, kd),
                   cu_seqlens=torch.tensor([0, 13, 30], dtype=torch.int32))
    path = write_inputs(tmp_path / "one.safetensors", tensors, lower_bound=-2.0)
    (case,) = replay_cases(path)
    assert case.seqlens == (13, 17) and case.lower_bound == -2.0 and case.K == kd
    res = runner.invoke(None, ["check", f"{MOD}:honest_fp32", "recipe:flashkda", "--device",
                               "cpu", "--inputs", str(path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    bad = runner.invoke(None, ["check", f"{MOD}:drops_initial_state", "--device", "cpu",
                               "--inputs", str(path), "--out", str(tmp_path / "p")])
    assert bad.exit_code == 1, bad.output


def test_bad_inputs_are_one_line_errors(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    empty = tmp_path / "empty"
    empty.mkdir()
    for path, needle in ((junk, "cannot read"), (empty, "no .safetensors files")):
        res = runner.invoke(None, ["check", "recipe:fp32", "--device", "cpu", "--inputs",
                                   str(path), "--out", str(tmp_path / "o")])
        assert res.exit_code == 2 and needle in res.output, res.output
        assert res.output.startswith("error:") and len(res.output.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="missing q"):
        write_inputs(tmp_path / "x.safetensors", {}, lower_bound=-5.0)
    with pytest.raises(ValueError, match="limit"):
        with capture("kdalab.kda:forward", tmp_path, limit=0):
            pass
