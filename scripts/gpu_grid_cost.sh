#!/usr/bin/env bash
# The paper grid's cost on a lent card, then the graphed-vs-eager check, in one command that fits one device call
# (docs/performance.md "The paper grid"; issue 40 items 3 and 5):
#   1. scripts/gpu_pack.py --phases trials --trials-surrogates gmm attention_centroid --trials-no-mps: whole paper
#      trials (cem-bench train, a 10-epoch slice with both attacks at full size): 2 gmm at once under MPS (the
#      grid's packing) and 2 attention_centroid at once under MPS (120 of the grid's 165 trials train an
#      attention surrogate: the summary brackets the grid between gmm's cost and theirs), the two the grid's
#      GPU-hours need, first; then, as the budget allows, gmm alone and 2 gmm at once without MPS (skipped where
#      MPS did not start: the pairs already ran without it, and the grid's line says "without MPS"). By estimate
#      (not yet run on an H100) 170 + 200 + 110 s of the default 520 s: the last pair's 170 s do not fit. The
#      attention pair, once gmm's has run, may run into the check's reserve (until 40 s before TOTAL ends);
#   2. scripts/gpu_check.py --stages env equivalence summary with what is left: the plain graphed step of lambda = 0
#      and of each surrogate against its eager step, then three with noise and dropout (no compile, no own stream:
#      what 1380ead's gate multiplier changed in the captured step; gpu_check's own default runs all variants).
#
# In that order of priority: the grid's GPU-hours (both pairs), the lone trial, the check. At the estimates the
# lone trial leaves the check about 55 s or nothing (under 50 s left: not started), so on a card this most
# likely exits 3: expected, the pack's files are what the call is for.
#
#   OUT=/some/folder bash scripts/gpu_grid_cost.sh [TOTAL_SECONDS]     # default 570
#
# Every result is written under $OUT as it is made (pack/pack.jsonl a row at a time, pack/summary.md again after
# each row, each check stage's file as the stage ends), so a device call cut off at its limit still brings back
# what was measured. gpu_pack's budget ends at a deadline on this script's clock (--deadline), which starts before
# its `import torch`. At the end the check's files go into check.tgz (a device call returns at most 8 files):
# $OUT holds pack/pack.jsonl, pack/summary.md, check.tgz and check_summary.md. Without CUDA it is a dry run of
# both scripts at tiny sizes: give it a TOTAL of 300 or more (tests/test_gpu_path.py gives 1500); at 120 the
# pack took 88 s on 2 busy CPUs and left the check no time (2026-12-06). check_summary.md is always written: the
# check's own summary, or, where the check was cut off at its timeout (its equivalence stage can start a
# configuration that outlasts it), the summary stage run alone on what the check wrote, or failing that a note
# of why there is none. It exits 3 when the check did not end by itself (no time, cut off, failed): the pack's
# files still come back.
set -u
usage="usage: OUT=/some/folder bash scripts/gpu_grid_cost.sh [TOTAL_SECONDS]   (a whole number of seconds, default 570)"
case "${1:-570}" in
    -h|--help) echo "$usage"; exit 0 ;;
    ''|*[!0-9]*|0*) echo "gpu_grid_cost: TOTAL_SECONDS must be a positive whole number, not '${1}'; $usage" >&2
                    exit 2 ;;   # checked before anything under \$OUT is removed
esac
total=${1:-570}
if [ "${#total}" -gt 6 ] || [ "$total" -le 50 ]; then   # gpu_pack refused a budget of TOTAL - 50 <= 0 after the rm below
    echo "gpu_grid_cost: TOTAL_SECONDS must be above 50 and at most 999999 (the pack's budget is TOTAL - 50 s), not" \
         "'${total}'; $usage" >&2
    exit 2
fi
out=${OUT:-/tmp/cem_gpu_grid_cost}
# the checkout: cem_bench is in no site-packages on a lent machine (both scripts also put it on sys.path)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$out/pack" "$out/check" "$out/check.tgz" "$out/check_summary.md"   # gpu_pack appends to pack.jsonl
mkdir -p "$out/pack" "$out/check"
start=$(date +%s)
# the trials first: the check gets what their budget's skipped runs leave. The deadline is on this clock, so the
# cold start (gpu_pack's `import torch`, 10-20 s on a cold machine) is inside the budget; a run started within it
# may go on until 5 s before it. The hard deadline, 20 s later, is where `timeout` ends gpu_pack: only the pair
# that completes the grid's line may run into those 20 s and the check's reserve after them (its timeout ends
# 10 s before the hard deadline; the check, last in priority, then gets no time). -k: a SIGTERM during a pair
# whose MPS daemon is wedged must not hold the call past its limit (gpu_pack's handlers give the daemon 5 + 5 s)
pack_budget=$(( total - 50 ))
hard_deadline=$(( start + total - 30 ))
pack_timeout=$(( hard_deadline - $(date +%s) ))
timeout -k 15 $(( pack_timeout > 1 ? pack_timeout : 1 )) python3 scripts/gpu_pack.py --phases trials \
    --trials-surrogates gmm attention_centroid --trials-no-mps --budget-s "$pack_budget" \
    --deadline $(( start + pack_budget )) --hard-deadline "$hard_deadline" --out "$out/pack"
left=$(( total - ($(date +%s) - start) - 15 ))
check_done=no
if [ "$left" -gt 50 ]; then
    # 10 s of what is left are kept for the summary stage alone, should this be cut off at its timeout; only
    # `summary` follows the equivalence stage: it leaves 10 s of the budget, not the 60 s of the default stages
    check_s=$(( left - 10 ))
    OUT="$out/check" timeout "$check_s" python3 scripts/gpu_check.py --stages env equivalence summary \
        --budget-s $(( check_s - 10 )) --equivalence-cap-s $(( check_s - 40 )) --equivalence-reserve-s 10 \
        --equivalence-configs lambda=0 gmm gated_attention slot_cross attention_centroid serial_enhanced \
        "lambda=0 (noise+dropout)" "gated_attention (noise+dropout)" "slot_cross (noise+dropout)"
    if [ -f "$out/check/summary.md" ]; then
        check_done=yes
    else
        echo "[gpu_grid_cost] the check ended without its summary: the summary stage alone, on what it wrote"
        # GPU_GRID_SUMMARY_S: the tests' CPU, busy with other work, may need more than the device's 10 s to start
        # Python and read the check's files (2026-12-07: a clean-clone `make test` beside a search failed so)
        OUT="$out/check" timeout "${GPU_GRID_SUMMARY_S:-10}" python3 scripts/gpu_check.py --stages summary
    fi
    why="the check was cut off at its ${check_s}-s timeout or failed, and its summary stage alone did not finish"
else
    echo "[gpu_grid_cost] no time left for the equivalence check ($left s)"
    why="no time was left for it after the trials ($left s)"
fi
if [ -f "$out/check/summary.md" ]; then
    cp "$out/check/summary.md" "$out/check_summary.md"
    if [ "$check_done" != yes ]; then
        note="(written by the summary stage alone: the check ended without one, cut off at its timeout or failed;"
        note="$note what it had not run is missing)"
        { head -n 1 "$out/check/summary.md"; printf '\n%s\n' "$note"; tail -n +2 "$out/check/summary.md"; } \
            > "$out/check_summary.md"
    fi
else
    printf '# gpu_check: no summary\n\n%s. Its files, if any, are in check.tgz:\n\n%s\n' "$why" \
        "$(ls "$out/check")" > "$out/check_summary.md"
fi
tar czf "$out/check.tgz" -C "$out" check && rm -rf "$out/check"
cat "$out/pack/summary.md" 2>/dev/null
echo "[gpu_grid_cost] done in $(( $(date +%s) - start )) s"
if [ "$check_done" != yes ]; then
    echo "[gpu_grid_cost] the graphed-vs-eager check did not end by itself (see check_summary.md)"
    exit 3
fi
