#!/usr/bin/env bash
# Issue 15: where the whole `kdalab sweep` command's time goes on the H200 (kind nvidia-h200
# or -x2, nothing carried): the start of a CUDA process alone, then the 94,500-run command of
# sweep_remeasure.sh (a) once warm and once under cProfile (the driver's thread; the store's
# writer thread and the draw processes are not in it). Writes $OUT/sweep.prof and prints the
# top functions by cumulative and by own time.
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
AXES="--families floor,weak_decay_correlated,model_like --chunks 2-64 --seeds 0-499 --dims 128 --accumulation h200 --device cuda"
/usr/bin/time -f "python + import torch + CUDA init: %e s" \
    python3 -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
/usr/bin/time -f "import kdalab.cli + --help: %e s" python3 -m kdalab --help > /dev/null
rm -rf /tmp/sw0 && /usr/bin/time -f "kdalab sweep (warm-up run): %e s" \
    python3 -c "import sys; from kdalab.cli import main; sys.argv[0]='kdalab'; main()" \
    sweep $AXES --out /tmp/sw0 --quiet
rm -rf /tmp/sw1 && /usr/bin/time -f "kdalab sweep under cProfile: %e s" python3 - <<PY
import cProfile, pstats, sys
sys.argv = ["kdalab", "sweep"] + "$AXES".split() + ["--out", "/tmp/sw1", "--quiet"]
from kdalab.cli import main
prof = cProfile.Profile()
prof.enable()
try:
    main()
except SystemExit:
    pass
prof.disable()
prof.dump_stats("$OUT/sweep.prof")
st = pstats.Stats(prof)
st.sort_stats("cumulative").print_stats(45)
st.sort_stats("tottime").print_stats(30)
PY
