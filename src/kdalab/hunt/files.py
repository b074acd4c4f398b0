"""A hunt's folder: ``hunt.json`` (the run), ``trials.jsonl`` (one record per trial, streamed),
``worst.json`` (the worst case: its errors, its spec and seed, enough to rebuild it) and
``worst.safetensors`` (the worst case's tensors as a check case file). The views
(``progress.png``, ``report.md``) are drawn by :mod:`kdalab.views.hunt`.

The case file holds tensors named as chunk_kda_fwd's arguments, ``q, k, v, g, beta, A_log,
dt_bias`` (none of the last two for a ``log_decay`` case) and, where the case has them,
``initial_state`` and ``cu_seqlens``, with the metadata strings ``gate`` (the gate mode),
``lower_bound`` (``none`` without one) and ``scale`` (Python's shortest round-trip ``repr`` of the
floats), ``use_qk_l2norm`` (``true``: the kernel normalizes q and k) and, for the record, ``spec``
(JSON), ``seed`` and ``target``: check's case-file format (:mod:`kdalab.check.replay`).

A hunt's folder is also what a hunt resumes from (:func:`resume_folder`): hunt.json says which
hunt it holds, trials.jsonl what it did.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from kdalab import params
from kdalab.check.gradients import GRADIENTS
from kdalab.check.replay import gate_metadata
from kdalab.hunt.evaluate import gradient_floors, score
from kdalab.hunt.search import HuntConfig, HuntResult
from kdalab.inputs.sequences import SequenceSpec, draw
from kdalab.records.identity import LOCK

__all__ = ["prepare_folder", "resume_folder", "read_meta", "read_trials", "MATCHED", "TrialWriter",
           "write_meta", "write_results", "worst_document", "rebuild", "write_case", "read_case",
           "META", "TRIALS", "WORST", "CASE"]

META, TRIALS, WORST, CASE = "hunt.json", "trials.jsonl", "worst.json", "worst.safetensors"
OWN = (META, TRIALS, WORST, CASE, "progress.png", "progress.svg", "report.md")


def prepare_folder(out: str | Path, *, force: bool = False) -> Path:
    """The output folder (``~`` expanded; created if missing). A non-empty folder is refused
    unless ``force``: a hunt's (hunt.json) because its trials would be lost (``--resume``
    continues it), another's because it is not the hunt's; with ``force`` a hunt's own files
    are replaced and nothing else is touched."""
    path = params.output_folder(out, "--out")
    entries = set(os.listdir(path)) - {LOCK}  # a hunt's lock, as every store's
    if entries and not force:
        if META in entries:
            raise ValueError(f"--out: {str(path)!r} holds a hunt; --resume continues it, "
                             f"--force starts it afresh (its trials are replaced)")
        raise ValueError(f"--out: {str(path)!r} holds files that are not a hunt's; choose "
                         f"another folder or give --force")
    for name in OWN:
        (path / name).unlink(missing_ok=True)
    return path


#: what a resumed hunt must share with the hunt in its folder, by the option that sets it
MATCHED = {"target": "TARGET", "device": "--device", "seed": "--seed",
           "threshold": "--threshold", "sampler": "the sampler", "grad": "--grad",
           **{f"bounds.{k}": v for k, v in (
               ("min_T", "--min-T"), ("max_T", "--max-T"), ("min_heads", "--min-heads"),
               ("max_heads", "--max-heads"), ("dims", "--dims"), ("lower_bound", "--lower-bound"),
               ("max_sequences", "--max-sequences"), ("initial_states", "the initial states"),
               ("gates", "--gates"))}}


def _get(document: dict, key: str):
    for part in key.split("."):
        document = document.get(part) if isinstance(document, dict) else None
    return document


def resume_folder(out: str | Path, cfg: HuntConfig) -> tuple[Path, dict, list[dict]]:
    """The folder of the hunt to resume (``~`` expanded), its hunt.json and its trial records
    (:func:`read_trials`). ValueError when it holds no hunt, or a hunt whose configuration
    differs from ``cfg`` (naming the option); nothing is changed then."""
    path, meta = params.user_path(out, "--out"), read_meta(out)
    meta["bounds"].setdefault("gates", ["lower_bound"])  # a hunt from before the gate knob
    if not os.access(path, os.W_OK | os.X_OK) or not os.access(path / META, os.W_OK):
        raise ValueError(f"--out: cannot write into {str(path)!r} (permission denied)")
    ours = cfg.as_dict()
    for key, option in MATCHED.items():
        if _get(meta, key) != _get(ours, key):
            raise ValueError(f"--resume: {option} differs from the hunt in {str(path)!r}: it "
                             f"has {_get(meta, key)!r}, this run {_get(ours, key)!r}")
    return path, meta, read_trials(path)


def read_meta(out: str | Path) -> dict:
    """The hunt.json of the hunt to resume in ``out`` (``~`` expanded); ValueError when there is
    none."""
    path = params.user_path(out, "--out") / META
    if not path.is_file():
        raise ValueError(f"--resume: {str(path.parent)!r} holds no hunt (no {META}); start one "
                         f"without --resume")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--resume: cannot read {str(path)!r} ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("bounds"), dict):
        raise ValueError(f"--resume: {str(path)!r} is not a hunt's description")
    return meta


#: the keys of a trial's record that a resumed hunt reads
_RECORD = {"trial", "seed", "status", "objective", "output_error", "params", "elapsed_s"}


def read_trials(folder: Path, *, repair: bool = True) -> list[dict]:
    """trials.jsonl's records. A torn last line (a kill while it was written) is dropped and,
    with ``repair`` (a hunt resuming into its own folder), cut from the file, so that the next
    record starts on a line of its own; without it the file is only read (a replay of another's
    hunt). A bad line before the last one is a ValueError."""
    where = "--resume: " if repair else ""
    path = folder / TRIALS
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    records, kept = [], 0
    for i, line in enumerate(lines):
        if not line.strip():
            kept += len(line) + 1
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i < len(lines) - 1 and any(x.strip() for x in lines[i + 1:]):
                raise ValueError(f"{where}line {i + 1} of {str(path)!r} is not a trial's "
                                 f"record") from None
            break
        if not isinstance(rec, dict) or not _RECORD <= rec.keys() or rec["status"] not in (
                "measured", "unsupported", "raised"):
            raise ValueError(f"{where}line {i + 1} of {str(path)!r} is not a trial's record")
        records.append(rec)
        if i == len(lines) - 1:  # a whole record without its newline: kept, the newline added
            if repair:
                with open(path, "ab") as f:
                    f.write(b"\n")
            return records
        kept += len(line) + 1
    if kept < len(data) and repair:
        with open(path, "r+b") as f:
            f.truncate(kept)
    return records


def _json(value) -> str:
    """JSON with non-finite numbers as ``Infinity`` / ``NaN`` (Python's json reads them)."""
    return json.dumps(value, allow_nan=True, sort_keys=False)


class TrialWriter:
    """Appends each trial's record to trials.jsonl as it ends (an interrupted hunt keeps them)."""

    def __init__(self, folder: Path):
        self._file = open(folder / TRIALS, "a", encoding="utf-8")

    def __call__(self, record: dict) -> None:
        self._file.write(_json(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def worst_document(result: HuntResult, cfg: HuntConfig) -> dict | None:
    """worst.json's content: the worst case's errors, spec and seed (no timings: the same seed
    and trials give the same document, bit for bit); a ``--grad`` hunt's, each gradient's
    floor on the case too (``gradient_floors``: the float32 token recurrence's error, on the
    CPU whatever the hunt's device, as the draw does not depend on it) and
    ``grad_floor_multiple``, the worst gradient's error as a multiple of its floor."""
    w = result.worst
    if w is None:
        return None
    grads = {k: w.get(k) for k in (*(f"{n}_error" for n in GRADIENTS), "grad_error",
                                   "worst_grad", "grad_nonfinite")}
    if cfg.grad and w.get("grad_error") is not None:
        grads |= gradient_floors(SequenceSpec.from_dict(w["spec"]), int(w["seed"]))
        floor = grads.get(f"{w['worst_grad']}_floor_error")
        grads["grad_floor_multiple"] = (w["grad_error"] / floor if floor else None)
    return {
        "target": cfg.target, "device": cfg.device, "hunt_seed": cfg.seed, "trial": w["trial"],
        "output_error": w["output_error"], "state_error": w["state_error"],
        "output_nonfinite": w["output_nonfinite"], "state_nonfinite": w["state_nonfinite"],
        "bf16_floor": w["bf16_floor"], **(grads if cfg.grad else {}),
        "threshold": cfg.threshold,
        "exceeds_threshold": not score(w, cfg.grad) <= cfg.threshold,
        "seed": w["seed"], "spec": w["spec"], "params": w["params"],
        "rebuild": "kdalab.inputs.sequences.draw(SequenceSpec.from_dict(spec), seed)",
        **({"upstream": "kdalab.check.gradients.upstream(case inputs, seed): dO, dHT; "
            "kdalab check TARGET --grad --inputs worst.safetensors replays it"}
           if cfg.grad else {}),
    }


def rebuild(document: dict, device: str = "cpu") -> dict:
    """The worst case's inputs again, from worst.json's content."""
    return draw(SequenceSpec.from_dict(document["spec"]), int(document["seed"]), device)


def write_case(path: Path, inputs: dict, extra: dict[str, str] | None = None) -> None:
    """A draw as a check case file (safetensors)."""
    from safetensors.torch import save_file

    names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens")
    tensors = {n: inputs[n].detach().cpu().contiguous() for n in names
               if inputs.get(n) is not None}
    meta = {**gate_metadata(inputs["gate"], inputs["lower_bound"]),
            "scale": repr(float(inputs["scale"])),
            "use_qk_l2norm": str(bool(inputs["use_qk_l2norm"])).lower(), **(extra or {})}
    save_file(tensors, str(path), metadata=meta)


def read_case(path: Path) -> dict:
    """A case file back: the tensors, ``gate``, ``lower_bound`` (a float or None) and ``scale``,
    the other metadata as strings under ``metadata``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        out = {n: f.get_tensor(n) for n in f.keys()}
        meta = dict(f.metadata() or {})
    for name in ("initial_state", "cu_seqlens", "A_log", "dt_bias"):
        out.setdefault(name, None)
    out["gate"] = meta.get("gate", "lower_bound")
    out["lower_bound"] = None if meta["lower_bound"] == "none" else float(meta["lower_bound"])
    out["scale"] = float(meta["scale"])
    out["use_qk_l2norm"] = meta.get("use_qk_l2norm", "true") == "true"
    out["metadata"] = meta
    return out


def write_meta(folder: Path, meta: dict) -> Path:
    """hunt.json (written when the hunt starts, so that its folder is known as a hunt's, and
    again at the end)."""
    path = folder / META
    path.write_text(json.dumps(meta, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    return path


def write_results(folder: Path, result: HuntResult, cfg: HuntConfig, meta: dict) -> list[Path]:
    """hunt.json, worst.json and the case file; returns the paths written."""
    meta = {**meta, **cfg.as_dict(), "trials_run": len(result.records), "counts": result.counts,
            "elapsed_s": round(result.elapsed_s, 1), "found": result.found}
    paths = [write_meta(folder, meta)]
    doc = worst_document(result, cfg)
    if doc is not None:
        paths.append(folder / WORST)
        paths[-1].write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n", encoding="utf-8")
        paths.append(folder / CASE)
        write_case(paths[-1], rebuild(doc), {
            "spec": _json(doc["spec"]), "seed": str(doc["seed"]), "target": cfg.target,
            **{k: repr(doc[k]) if math.isfinite(doc[k]) else "inf"
               for k in ("output_error", "grad_error") if k in doc}})
    return paths
