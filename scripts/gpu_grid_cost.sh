#!/usr/bin/env bash
# The paper grid's cost on a lent card, then the graphed-vs-eager check, in one command that fits one device call
# (docs/performance.md "The paper grid"; issue 40 items 3 and 5):
#   1. scripts/gpu_pack.py --phases trials --trials-surrogates gmm attention_centroid --trials-no-mps: whole paper
#      trials (cem-bench train, a 10-epoch slice with both attacks at full size): gmm alone, 2 gmm at once under
#      MPS (the grid's packing), 2 attention_centroid at once under MPS (120 of the grid's 165 trials train an
#      attention surrogate: the summary brackets the grid between gmm's cost and theirs), then, if the budget
#      holds, 2 gmm at once without MPS; about 7.7 min on an H100 by estimate (not yet run on one);
#   2. scripts/gpu_check.py --stages env equivalence summary with what is left: the plain graphed step of lambda = 0
#      and of each surrogate against its eager step, then three with noise and dropout (no compile, no own stream:
#      what 1380ead's gate multiplier changed in the captured step; gpu_check's own default runs all variants).
#
#   OUT=/some/folder PYTHONPATH=. bash scripts/gpu_grid_cost.sh [TOTAL_SECONDS]     # default 570
#
# Everything lands in $OUT/run.tgz (a device call returns at most 8 files), and the two summaries beside it.
# Without CUDA it is a dry run of both scripts at tiny sizes (47 s on 2 CPUs; the equivalence stage needs CUDA).
set -u
total=${1:-570}
out=${OUT:-/tmp/cem_gpu_grid_cost}
work=$(mktemp -d /tmp/cem-bench-gridcost-XXXXXX)
start=$(date +%s)
pack_budget=$(( total - 20 ))    # the trials first: the check gets what their budget's skipped runs leave
timeout $(( pack_budget + 10 )) python3 scripts/gpu_pack.py --phases trials --trials-surrogates gmm \
    attention_centroid --trials-no-mps --budget-s "$pack_budget" --out "$work/pack"
left=$(( total - ($(date +%s) - start) - 15 ))
if [ "$left" -gt 40 ]; then
    OUT="$work/check" timeout "$left" python3 scripts/gpu_check.py --stages env equivalence summary \
        --budget-s $(( left - 10 )) --equivalence-cap-s $(( left - 40 )) --equivalence-configs lambda=0 \
        gmm gated_attention slot_cross attention_centroid serial_enhanced "lambda=0 (noise+dropout)" \
        "gated_attention (noise+dropout)" "slot_cross (noise+dropout)"
else
    echo "[gpu_grid_cost] no time left for the equivalence check ($left s)"
fi
mkdir -p "$out"
tar czf "$out/run.tgz" -C "$work" .
cp "$work/pack/summary.md" "$out/pack_summary.md" 2>/dev/null
cp "$work/check/summary.md" "$out/check_summary.md" 2>/dev/null
cat "$work/pack/summary.md" 2>/dev/null
rm -rf "$work"
echo "[gpu_grid_cost] done in $(( $(date +%s) - start )) s"
