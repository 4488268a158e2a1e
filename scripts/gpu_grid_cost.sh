#!/usr/bin/env bash
# The paper grid's cost on a lent card, then the graphed-vs-eager check, in one command that fits one device call
# (docs/performance.md "The paper grid"; issue 40 items 3 and 5):
#   1. scripts/gpu_pack.py --phases trials --trials-surrogates gmm attention_centroid --trials-no-mps: whole paper
#      trials (cem-bench train, a 10-epoch slice with both attacks at full size): gmm alone, 2 gmm at once under
#      MPS (the grid's packing), 2 attention_centroid at once under MPS (120 of the grid's 165 trials train an
#      attention surrogate: the summary brackets the grid between gmm's cost and theirs), then, if the budget
#      holds, 2 gmm at once without MPS; about 8 min on an H100 by estimate (not yet run on one);
#   2. scripts/gpu_check.py --stages env equivalence summary with what is left: the plain graphed step of lambda = 0
#      and of each surrogate against its eager step, then three with noise and dropout (no compile, no own stream:
#      what 1380ead's gate multiplier changed in the captured step; gpu_check's own default runs all variants).
#
#   OUT=/some/folder bash scripts/gpu_grid_cost.sh [TOTAL_SECONDS]     # default 570
#
# Every result is written under $OUT as it is made (pack/pack.jsonl a row at a time, each check stage's file as the
# stage ends), so a device call cut off at its limit still brings back what was measured. At the end the check's
# files go into check.tgz (a device call returns at most 8 files): $OUT holds pack/pack.jsonl, pack/summary.md,
# check.tgz and check_summary.md. Without CUDA it is a dry run of both scripts at tiny sizes: give it a TOTAL of
# 300 or more (tests/test_gpu_path.py gives 1500); at 120 the pack took 88 s on 2 busy CPUs and left the check no
# time (2026-12-06). It exits 3 when check_summary.md is missing (the check got no time or failed): the pack's
# files still come back.
set -u
usage="usage: OUT=/some/folder bash scripts/gpu_grid_cost.sh [TOTAL_SECONDS]   (a whole number of seconds, default 570)"
case "${1:-570}" in
    -h|--help) echo "$usage"; exit 0 ;;
    ''|*[!0-9]*|0*) echo "gpu_grid_cost: TOTAL_SECONDS must be a positive whole number, not '${1}'; $usage" >&2
                    exit 2 ;;   # checked before anything under \$OUT is removed
esac
total=${1:-570}
out=${OUT:-/tmp/cem_gpu_grid_cost}
# the checkout: cem_bench is in no site-packages on a lent machine (both scripts also put it on sys.path)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$out/pack" "$out/check" "$out/check.tgz" "$out/check_summary.md"   # gpu_pack appends to pack.jsonl
mkdir -p "$out/pack" "$out/check"
start=$(date +%s)
# the trials first: the check gets what their budget's skipped runs leave. gpu_pack's clock starts after its
# `import torch` (10-20 s on a cold machine): the timeout gives that much beyond its budget, so that its last
# run, which may go on until 5 s before the budget ends, still writes its summary
pack_budget=$(( total - 50 ))
timeout $(( pack_budget + 30 )) python3 scripts/gpu_pack.py --phases trials --trials-surrogates gmm \
    attention_centroid --trials-no-mps --budget-s "$pack_budget" --out "$out/pack"
left=$(( total - ($(date +%s) - start) - 15 ))
if [ "$left" -gt 40 ]; then
    # only `summary` follows the equivalence stage: it leaves 10 s of the budget, not the 60 s of the default stages
    OUT="$out/check" timeout "$left" python3 scripts/gpu_check.py --stages env equivalence summary \
        --budget-s $(( left - 10 )) --equivalence-cap-s $(( left - 40 )) --equivalence-reserve-s 10 \
        --equivalence-configs lambda=0 gmm gated_attention slot_cross attention_centroid serial_enhanced \
        "lambda=0 (noise+dropout)" "gated_attention (noise+dropout)" "slot_cross (noise+dropout)"
else
    echo "[gpu_grid_cost] no time left for the equivalence check ($left s)"
fi
cp "$out/check/summary.md" "$out/check_summary.md" 2>/dev/null
tar czf "$out/check.tgz" -C "$out" check && rm -rf "$out/check"
cat "$out/pack/summary.md" 2>/dev/null
echo "[gpu_grid_cost] done in $(( $(date +%s) - start )) s"
if [ ! -f "$out/check_summary.md" ]; then
    echo "[gpu_grid_cost] no check_summary.md: the graphed-vs-eager check did not finish (see above)"
    exit 3
fi
