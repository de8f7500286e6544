#!/usr/bin/env bash
# One device-tool call that does a session's GPU work and brings everything back in ONE archive:
#   run  carry [".device-a/activate.sh", ".device-a/kernels.tar.xz", ".device-b", ".device-c"]  (tests, probes: ~62 MB)
#        — the pipeline also needs ".device-a/notebook.tar.xz": all three bundles whole with the tree (~67.6 MB, session
#        44) no longer fit the 64 MiB; carry it in a second call while the machine is warm, or cold: .device-a whole +
#        .device-b (~66.7 MB) and .device-c in the next call (FA4's tvm_ffi lives in .device-b: D6 / D7 need it too)
#        command: bash scripts/gpu_session.sh <commit> [what ...]
#   <commit>: this machine's `git rev-parse --short HEAD`, written into the command as a literal — on a warm device
#   machine `$(git rev-parse ...)` read the first call's commit again (session 30: two later calls were stamped with it)
# what: tests (scripts/gpu_check.sh), pipeline (every stage), bench (bench_sparse, bench_nvfp4, quick_bench),
# ab (scripts/ab_time.py against the tree in .ab/before, when carried), probes (host µs split into launches and the
# rest, and with a compiled call per kernel; D7 B1 at 5 / 8 / 10 splits beside FlashMLA; D6's prefill with both grid
# orders over a 32 MiB (L2-resident) and a 256 MiB key pool: H100 read 0.79x FlashMLA at H128 on the small pool); d1 (scripts/sweep_d1.py: the hd64 and hd256
# causal schedule candidates vs FA4 — D1's worst shapes — ~4 min); d7why (probe_d7 --trace: the half-tile
# event trace at four shapes; ~2 min);
# d7hints / d7idx / d7staged: probe_d7's load-hint, index-staging and staged-rows variants; gatherroof
# (scripts/gather_roof_d7.py: torch's gather of the D7 shapes' key bytes beside ours); d7fused (the fused-merge
# candidate against the combine launch at B1 / B2 / B4); splitsparse (scripts/split_sweep_sparse.py: D6 / D2 split
# counts at 4-32 tokens); combinerows (scripts/probe_combine_rows.py: D7's small merges by either combine); d7store (B1's partial
# store: none / half / all); d7alt (the ALTERNATE_HALF_TILES candidate's tests and timing; d7alttrace its event traces); d7peer (H128 without / with half the crossover's DSMEM stores); d7peerfp8 (PEER_FP8 against peer_bf16, then the d7 + sparse GPU tests); d7peerparts (PEER_FP8's peer rows left unconverted); splitphases (probe_split_phases.py at 32-64 tokens);
# clustersweep: gathered splits as one cluster vs split + combine (bf16 probe, D7 sweep); candidate=a+b: host-path
# candidates applied, the D7 GPU tests they touch ($CAND_K), the FP8-cache host bench; hostab=a+b (host µs, main and
# the patched tree alternately); hostargs (probe_host_args.py); ffiargs
# (probe_ffi_args.py);
# ncu7 / ncu7p / ncu1 / ncu6: Nsight Compute on one D7 call (B128 H64; ncu7p: the FP8-cache prefill's B4096 H64) / D1's hd64 causal (ours and FA4) / D6's bf16
# prefill (ours and FlashMLA), per-SASS samples summarized by scripts/ncu_sass.py;
# pipeline=D7 (stages named, comma-separated); pipeline1 / pipeline2: the stages in two calls (the whole pipeline took > 560 s on the H100, session 31).
# default: all three — about 10 min, over the 600 s a call may take: run "tests" in one call, "pipeline1" and
# "pipeline2" in the next two (each within 30 s of the last: a warm machine keeps the unpacked bundles).  Results land in $OUT/session.tgz (stages/results/<gpu>.json, STATUS.md, stage logs and
# metrics, test logs, bench output) — copy stages/results/<gpu>.json and stages/gpu_tests/<gpu>.json back from it.  Why one archive: the next
# call re-syncs the tracked tree (overwriting the results this run wrote) and only a few files come back.
set -u
commit=${1:?usage: gpu_session.sh <commit> [tests|pipeline|bench ...]}; shift
what=${*:-tests pipeline bench}
source .device-a/activate.sh >/dev/null
source .device-b/activate.sh >/dev/null
export DSV4_COMMIT=$commit
# a mistyped literal stamps every record with a commit that does not exist (session 48, twice): say so loudly — on a
# warm machine whose git copy predates the commit this warns for a good literal too (then compare by hand)
stamp_warning=""
git cat-file -e "$commit^{commit}" 2>/dev/null \
    || stamp_warning="WARNING: commit $commit is not in this copy's git history — check the literal against git rev-parse"
[ -n "$stamp_warning" ] && echo "$stamp_warning"
out=${OUT:-runs/gpu_session}; mkdir -p "$out/logs"

# the pipeline on the stages named (comma-separated; none: every stage) under a time limit, its log as LOG.txt, its
# verdict lines printed
run_stages() {  # STAGES LOG LIMIT_S STAGE_TIMEOUT_S
  timeout "$3" python -m dsv4lib.workbook.pipeline ${1:+--stages "$1"} --timeout "$4" > "$out/logs/$2.txt" 2>&1
  tr '\r' '\n' < "$out/logs/$2.txt" | grep -E "^\s+\S+\s+(PASS|FAIL|COMPILED-ONLY|NOT RUN)"
}

# docs/tuning/candidates/NAME.patch applied to this copy unless it is applied already (a warm machine keeps a patched
# tree); non-zero, said, when it does not apply
apply_candidate() {  # NAME
  local cand=docs/tuning/candidates/$1.patch
  git apply -R --check "$cand" 2>/dev/null || git apply "$cand" || { echo "candidate $1 does not apply"; return 1; }
}

# candidates of docs/tuning/candidates/ applied to this copy, then the D7 GPU tests matching PYTEST_K and the FP8-cache
# calls' host times
run_candidate() {  # LOG PYTEST_K PATCH_NAME...
  local log=$1 k=$2; shift 2
  for name in "$@"; do apply_candidate "$name" || return; done
  { timeout 300 python -m pytest -q -p no:cacheprovider -m gpu ${CAND_TESTS:-tests/test_d7_fp8_decode.py} -k "$k"
    timeout 100 python scripts/bench_host.py --split --rounds 3 --only sparse_decode,sparse_prefill; } 2>&1 \
    | tee "$out/logs/$log.txt" | grep -v "^\s*$" | tail -n 16
}

# host µs, main against the candidate patches, alternating (a patched tree reads its builds anew: each bench
# process compiles what it calls); HOSTAB_ONLY picks the calls
run_host_ab() {  # PATCH_NAME...
  local only=${HOSTAB_ONLY:-attention,sparse_decode,sparse_prefill,sparse_attention}
  for round in 1 2; do
    for side in main patched; do
      if [ $side = patched ]; then for name in "$@"; do git apply "docs/tuning/candidates/$name.patch" \
          || { echo "candidate $name does not apply"; return; }; done; fi
      timeout 150 python scripts/bench_host.py --rounds 3 --only "$only" > "$out/logs/hostab_${side}_$round.txt" 2>&1
      if [ $side = patched ]; then for name in "$@"; do git apply -R "docs/tuning/candidates/$name.patch"; done; fi
    done
  done
  for name in "$@"; do git apply "docs/tuning/candidates/$name.patch"; done
  python scripts/host_ab.py "$out"/logs/hostab_main_*.txt -- "$out"/logs/hostab_patched_*.txt | tee "$out/logs/hostab.txt"
}

# Nsight Compute (--set full) on the kernels a script launches inside its profiled range (scripts/ncu_profile.py),
# then the per-SASS-instruction table summarized (scripts/ncu_sass.py)
run_ncu() {  # NAME LAUNCHES SCRIPT [ARGS...]
  local name=$1 launches=$2; shift 2
  timeout 240 ncu --profile-from-start off --launch-count "$launches" --set full -f -o "$out/$name" \
    python "$@" > "$out/logs/ncu_$name.txt" 2>&1
  ncu -i "$out/$name.ncu-rep" --page source --print-source sass --csv > "$out/${name}_sass.csv" 2>> "$out/logs/ncu_$name.txt"
  ncu -i "$out/$name.ncu-rep" --page details --csv > "$out/${name}_details.csv" 2>> "$out/logs/ncu_$name.txt"
  # the raw page: every metric, a column each — which pipe the busiest-pipe share of the details page was (ncu_pipes.py)
  ncu -i "$out/$name.ncu-rep" --page raw --csv > "$out/${name}_raw.csv" 2>> "$out/logs/ncu_$name.txt"
  tail -n 3 "$out/logs/ncu_$name.txt"; python scripts/ncu_sass.py "$out/${name}_sass.csv" --top 12
  python scripts/ncu_pipes.py "$out/${name}_raw.csv" | tee "$out/logs/pipes_$name.txt"
}

for w in $what; do
  case $w in
    # 4 groups at once since session 57 (the H200 machine has 16 cores; 3 at once took 384 s for ~1080 s of groups)
    tests)    OUT="$out/logs" GROUP_TIMEOUT=${GROUP_TIMEOUT:-150} PARALLEL=${PARALLEL:-4} bash scripts/gpu_check.sh > "$out/logs/gpu_check.txt" 2>&1
              python -m dsv4lib.workbook.gpu_tests "$out/logs/summary.json" >/dev/null   # stages/gpu_tests/<gpu>.json
              tail -n 14 "$out/logs/gpu_check.txt" ;;
    pipeline) run_stages "" pipeline "${PIPELINE_TIMEOUT:-330}" 200 ;;
    # groups=persistent,d1: only those gpu_check.sh groups (no stages/gpu_tests record: that is a whole run's)
    groups=*) OUT="$out/logs" GROUP_TIMEOUT=${GROUP_TIMEOUT:-300} PARALLEL=${PARALLEL:-2} \
                bash scripts/gpu_check.sh $(echo "${w#groups=}" | tr , ' ') > "$out/logs/gpu_check.txt" 2>&1
              tail -n 8 "$out/logs/gpu_check.txt" ;;
    # the whole pipeline ran past 560 s on the H100 in session 31: two calls, each bringing its results back (the
    # second call's tree re-sync overwrites the first's stages/results: merge the two archives' rows on this side)
    pipeline1) run_stages 00-env,D0-ref,D1,D1.3,D2 "$w" 560 250 ;;
    pipeline2) run_stages D5,D6,D7,NVFP4-1.0 "$w" 560 250 ;;
    # k=page_mask,staged_prefill: the GPU tests whose names match any of the words (pytest -k "a or b"), ~1-3 min
    k=*)      timeout 400 python -m pytest -q -p no:cacheprovider tests -k "$(echo "${w#k=}" | sed 's/,/ or /g')" \
                > "$out/logs/pytest_k.txt" 2>&1; tail -n 4 "$out/logs/pytest_k.txt" ;;
    # pipeline=D7 or pipeline=D6,D7: only those stages (a re-record of the stages the last change made stale)
    pipeline=*) run_stages "${w#pipeline=}" pipeline 560 300 ;;
    ab)       [ -d .ab/before/dsv4lib ] && timeout ${AB_TIMEOUT:-300} python scripts/ab_time.py --tree before=.ab/before \
                --tree after=. --out "$out/logs/ab.json" 2>&1 | tail -n 14 | tee "$out/logs/ab.txt" ;;
    # host µs of every public call (#28's bar), with launches stubbed (--split) and the cProfile of each call
    hostbench) { timeout 200 python scripts/bench_host.py --split --profile "$out/logs"; } 2>&1 \
                | tee "$out/logs/hostbench.txt" | tail -n 40 ;;
    # hoststaged: the staged prefill's host µs (#28's bar 25), three rounds (~1 min)
    hoststaged) { timeout 150 python scripts/bench_host.py --rounds 3 --only staged; } 2>&1 \
                | tee "$out/logs/hoststaged.txt" | grep -v "^\s*$" | tail -n 12 ;;
    # pageslaunch: candidates/staged_pages_one_launch.patch applied (the pages= staged call by one launch, session 60:
    # it lost 23-26 µs of device time for ~9 µs of host) against the pair builds: its GPU tests, the device µs both ways
    # (probe_staged --pages-launch), the host µs both ways (~3 min; leaves the tree patched)
    pageslaunch) apply_candidate staged_pages_one_launch || continue
                { timeout 200 python -m pytest -q -p no:cacheprovider tests/test_d7_fp8_decode.py tests/test_streams.py \
                     -k "given_pages or staged";
                timeout 150 python scripts/probe_staged.py --pages-launch;
                STAGED_PAGES_ONE_LAUNCH=0 timeout 100 python scripts/bench_host.py --rounds 3 --only staged;
                timeout 100 python scripts/bench_host.py --rounds 3 --only staged; } 2>&1 \
                | tee "$out/logs/pageslaunch.txt" | grep -v "^\s*$" | tail -n 30 ;;
    # mergeloads: D2's dense decode parts (probe_dense_decode) on the shipped build, then with
    # candidates/merge_loads_first.patch (the cluster merge's DSMEM loads all issued before the first sum, session 60)
    # and its GPU tests (the dense cluster, the paired cluster, D7's split clusters against their references); ~4 min,
    # leaves the tree patched
    mergeloads) { timeout 200 python scripts/probe_dense_decode.py --splits ""; } 2>&1 | grep -v -i warn \
                | tee "$out/logs/mergeloads_before.txt" | tail -n 9
              apply_candidate merge_loads_first || continue
              { timeout 200 python scripts/probe_dense_decode.py --splits "";
                timeout 300 python -m pytest -q -p no:cacheprovider tests/test_d6_sparse_attention.py \
                  tests/test_d7_fp8_decode.py -k "cluster_reduced_partials_match or paired_cluster_matches or split_clusters_match"; } \
                2>&1 | grep -v -i warn | tee "$out/logs/mergeloads_after.txt" | tail -n 12 ;;
    # densebf16: D2's dense decode parts on the shipped build, then with candidates/dense_bf16_partials.patch (the
    # dense split's partials in bf16, session 60) and its GPU tests (the dense cluster and split paths against the
    # reference); ~4 min, leaves the tree patched
    densebf16) { timeout 200 python scripts/probe_dense_decode.py --splits 64; } 2>&1 | grep -v -i warn \
                | tee "$out/logs/densebf16_before.txt" | tail -n 9
              apply_candidate dense_bf16_partials || continue
              { timeout 200 python scripts/probe_dense_decode.py --splits 64;
                timeout 300 python -m pytest -q -p no:cacheprovider tests/test_d6_sparse_attention.py \
                  tests/test_d2_split_kv.py -k "cluster_reduced_partials_match or split_kv_matches"; } \
                2>&1 | grep -v -i warn | tee "$out/logs/densebf16_after.txt" | tail -n 12 ;;
    # densestamps: the dense split kernel's CTAs stamped (loop end, merge end, exits; per cluster the wait for its
    # slowest split) — where its ~8 µs over the producer alone go (~1 min)
    densestamps) { timeout 200 python scripts/probe_dense_decode.py --stamps; } 2>&1 | grep -v -i warn \
                | tee "$out/logs/densestamps.txt" | tail -n 16 ;;
    # densedecode: D2's dense hd512 decode (B1 H64 KV 64k) split into its parts under graph replay — the call, the
    # split kernel, the combine, the producer alone, one MMA left out: the floor #28's 0.8 bar is read against (~1.5 min)
    densedecode) { timeout 240 python scripts/probe_dense_decode.py ${DENSE_ARGS:-}; } 2>&1 | grep -v -i warn \
                | tee "$out/logs/densedecode.txt" | tail -n 14 ;;
    # cvtrate: e4m3 pairs converted a ns by the placed bits (shipped) vs cvt.rn.f16x2.e4m3x2 (+ mul.f16x2): is the
    # f16-MMA plan's premise right (docs/tuning/d7.md, session 56; ~1 min)
    cvtrate) { timeout 120 python scripts/probe_cvt_rate.py; } 2>&1 | tee "$out/logs/cvtrate.txt" | tail -n 4 ;;
    # lastplans: every public call's host µs with the last-call plans (launch.LAST_PLANS) off and on, alternating in one
    # process (~2 min)
    lastplans) { timeout 240 python scripts/bench_host.py --ab-last-plans --rounds ${ROUNDS:-3}; } 2>&1 \
                | tee "$out/logs/lastplans.txt" | tail -n 30 ;;
    # touch: the staged prefill's scanned calls by the one-pass staging (STAGED_TOUCH, landed session 59) against
    # the pair builds: its GPU tests, the device µs both ways (probe_staged --touch: whole calls, then each way's
    # staging kernels) and the host µs both ways (~3 min)
    touch)    { timeout 300 python -m pytest -q -p no:cacheprovider tests/test_d7_fp8_decode.py -k "one_pass or staged";
                timeout 200 python scripts/probe_staged.py --touch;
                STAGED_TOUCH=0 timeout 100 python scripts/bench_host.py --rounds 3 --only staged;
                timeout 100 python scripts/bench_host.py --rounds 3 --only staged; } 2>&1 \
                | tee "$out/logs/touch.txt" | grep -v "^\s*$" | tail -n 30 ;;
    # d1clocks: D1's sweep shapes, ours and FA4 each alone under nvidia-smi sampling (SM clock, power), then
    # interleaved — is the dense forward power-bound as D6's prefill is (#32; ~2 min); D1_SHAPES=128:0
    # D1_VARIANTS="wg_pingpong=1" also times those builds of ours (probe_d1_clocks --variants)
    d1clocks) { timeout 400 python scripts/probe_d1_clocks.py ${D1_SHAPES:+--shapes $D1_SHAPES} \
                  ${D1_VARIANTS:+--variants "$D1_VARIANTS"}; } 2>&1 | grep -v -i warn | tee "$out/logs/d1clocks.txt" | tail -n 12 ;;
    # d1pingpong: candidates/d1_hd128_pingpong.patch applied (hd128 non-causal with the warpgroups taking turns), the
    # D1 GPU groups through it, then the sustained A/B against the shipped build (probe_d1_clocks, hd128 non-causal:
    # ours patched, ours wg_pingpong=0 = the shipped build, FA4; ~5 min); the tree is left patched
    d1pingpong) apply_candidate d1_hd128_pingpong || continue
              OUT="$out/logs" GROUP_TIMEOUT=300 PARALLEL=2 bash scripts/gpu_check.sh d1 persistent > "$out/logs/gpu_check.txt" 2>&1
              tail -n 4 "$out/logs/gpu_check.txt"
              { timeout 300 python scripts/probe_d1_clocks.py --shapes 128:0 --variants "wg_pingpong=0"; } 2>&1 \
                | grep -v -i warn | tee "$out/logs/d1pingpong.txt" | tail -n 6 ;;
    # hostargs: where sparse_decode's in-situ launch spends its ~5.6 µs over the bare compiled call (~1 min)
    hostargs) { timeout 150 python scripts/probe_host_args.py; } 2>&1 | tee "$out/logs/hostargs.txt" | tail -n 10 ;;
    # ffiargs: one TVM-FFI argument as a torch tensor against its data pointer (the pointer-ABI question, ~1 min)
    ffiargs)  { timeout 150 python scripts/probe_ffi_args.py; } 2>&1 | tee "$out/logs/ffiargs.txt" | tail -n 10 ;;
    probes)   { timeout 150 python scripts/bench_host.py --split; timeout 120 python scripts/bench_host.py --one-call 0;
                timeout 120 python scripts/bench_d7.py --no-bf16 --shapes 0 --splits 5,8,10;
                timeout 300 python scripts/probe_d6.py --variants full,token_fastest --pool-rows 32768;
                timeout 300 python scripts/probe_d6.py --variants full,token_fastest --pool-rows 262144; } 2>&1 \
                | tee "$out/logs/probes.txt" | tail -n 30 ;;
    # the causal persistent deal in L2 sections of heads (l2_section_mb) at hd64 / hd128 against FA4 on three shapes,
    # then the gathered split at 40-56 tokens x 1152 keys (candidates/gathered_split_long_lists.patch's question), ~6 min
    d1sections) { for shape in 4x8192 2x16384 8x4096; do
                  timeout 100 python scripts/sweep_d1.py --head-dim 64 --causal 1 --sections ${SEC64:-4,8,16} --shape $shape
                  timeout 100 python scripts/sweep_d1.py --head-dim 128 --causal 1 --sections ${SEC128:-8,16,24,32} --shape $shape
                done; [ -n "${NOSPLIT:-}" ] || timeout 150 python scripts/probe_split_phases.py --tokens 56,48,40 --keys 1152 --splits 2 --no-twice
                } 2>&1 | tee "$out/logs/d1sections.txt" | grep "^{\|refused\|tokens\|Error\|error" | tail -n 20 ;;
    # hd256 causal (one block a CTA) launched in L2 sections (its default since session 45) against the old grid
    # order (sections0) and other sizes, FA4 in the same run, three shapes, ~3 min
    d1s256)   { for shape in 4x8192 2x16384 8x4096; do
                  timeout 150 python scripts/sweep_d1.py --head-dim 256 --causal 1 --sections 0,16,64 --shape $shape
                done; } 2>&1 | tee "$out/logs/d1s256.txt" | grep "^{\|refused\|Error\|error" | tail -n 20 ;;
    # the PV wait below the softmax (pv_wait_block) at hd256 both masks and hd64 non-causal, FA4 in the same run (~4 min)
    d1pvwait) { timeout 150 python scripts/sweep_d1.py --head-dim 256 --causal both --shape 4x8192;
                timeout 120 python scripts/sweep_d1.py --head-dim 256 --causal 0 --shape 8x4096;
                timeout 120 python scripts/sweep_d1.py --head-dim 64 --causal 0 --shape 4x8192; } 2>&1 \
                | tee "$out/logs/d1pvwait.txt" | grep "^{\|refused\|Error\|error" | tail -n 12 ;;
    # unmasked_body (the loop in two, the second body without masks; session 45) against the loop in one ("masked")
    # and FA4, both masks at every head dim, with hd128's pingpong / late_rescale candidates (~8 min: over one
    # call's 600 s with the start — D1U_DIMS="128" runs one head dim); then d1unmaskedw: windowed builds, where the
    # knob (the loop in three) is not a default yet, W4096 at hd128 / hd256 / hd64 (~3 min)
    d1unmasked) { for D in ${D1U_DIMS:-256 64 128}; do
                timeout 200 python scripts/sweep_d1.py --head-dim $D --causal both --shape 4x8192
                done; } 2>&1 | tee "$out/logs/d1unmasked.txt" | grep "^{\|refused\|Error\|error" | tail -n 12 ;;
    d1unmaskedw) { for D in 128 256 64; do
                timeout 120 python scripts/sweep_d1.py --head-dim $D --causal 0 --window 4096 --shape 2x16384 \
                  --variants unmasked,unmasked_nopv
                done; } 2>&1 | tee "$out/logs/d1unmaskedw.txt" | grep "^{\|refused\|Error\|error" | tail -n 12 ;;
    # the built, never-timed D1 A/B knobs (all compile spill-free, no serialized wgmma: sweep_d1.py --check, session
    # 46): one_kv_state at every head dim, hd128's pingpong / late rescale / both, FA4 in the same runs, ~3 min
    d1ab)     { timeout 150 python scripts/sweep_d1.py --head-dim 128 --causal both --variants onestate,pingpong,late_rescale,pp_late
                timeout 120 python scripts/sweep_d1.py --head-dim 64 --causal both --variants onestate
                timeout 120 python scripts/sweep_d1.py --head-dim 256 --causal both --variants onestate; } 2>&1 \
                | tee "$out/logs/d1ab.txt" | grep "^{\|refused\|Error\|error" | tail -n 12 ;;
    d1)       { timeout 240 python scripts/sweep_d1.py --head-dim 64 --causal 1;
                timeout 240 python scripts/sweep_d1.py --head-dim 256 --causal 1; } 2>&1 | tee "$out/logs/d1.txt" \
                | grep "^{\|refused" ;;
    # where a D7 pair's time goes: the half-tile event trace (producer acquire / commit, consumer wait / release per
    # pipeline, SM clocks) at B1 H64, B128 H64, B64 H128, B128 H128 (~2 min)
    d7why)    { timeout 200 python scripts/probe_d7.py --shapes 0,2,3,4 --trace; } 2>&1 | tee "$out/logs/d7why.txt" \
                | grep -v "^\s*$" | tail -n 60 ;;
    # Nsight Compute: one D7 call at B128 H64 (scripts/ncu_d7.py); D1's worst shape, hd64 causal, ours and FA4
    # (scripts/ncu_d1.py); D6's bf16 sparse prefill on a 32 MiB pool, ours and FlashMLA (scripts/ncu_d6.py)
    ncu7)     run_ncu d7 1 scripts/ncu_d7.py 2 ;;
    # the FP8-cache prefill's build (each token a decode row): where its producer's warps stall (session 37's open
    # question: neither an L2 prefetch nor a second half-tile of loads in flight shortened its fills)
    ncu7p)    run_ncu d7p 1 scripts/ncu_d7.py 4096x64x128x512 ;;
    # the producer's key-byte loads with other cache paths (read-only .nc, L2-only .cg, no L1 allocation, FlashMLA's
    # L2::256B hint) at B128 H64, B128 H128 and the FP8 prefill's build; every variant asserted bit-equal (~3 min)
    d7hints)  { timeout 280 python scripts/probe_d7.py --shapes 2,4,4096x64x128x512 \
                  --variants full,nc_loads,cg_loads,l1_no_allocate,no_l2_256,full; } 2>&1 | tee "$out/logs/d7hints.txt" | tail -n 8 ;;
    # the index staging (STAGED_INDICES) against register loads, both orders, at B1 / B128 H64 / B128 H128 / the prefill
    d7idx)    { timeout 400 python scripts/probe_d7.py --shapes 0,2,4,4096x64x128x512 \
                  --variants full,register_indices,full; } 2>&1 | tee "$out/logs/d7idx.txt" | tail -n 6 ;;
    # the STAGED_ROWS candidate (nope bytes by cp.async, converted in place) against the shipped producer
    d7staged) { timeout 200 python scripts/probe_d7.py --shapes 0,2,4,4096x64x128x512 \
                  --variants full,staged_rows,staged_rows_nx,no_crossover; } 2>&1 | tee "$out/logs/d7staged.txt" | tail -n 9 ;;
    # the TWO_SLOTS_WITH_CROSSOVER candidate (apply docs/tuning/candidates/d7_two_slots.patch first) at the H128 shapes
    # the random-read roof of the D7 shapes: torch's gather of the same key bytes beside ours and FlashMLA, ~1.5 min
    gatherroof) { timeout 200 python scripts/gather_roof_d7.py --shapes 1,2,3,4; } 2>&1 | tee "$out/logs/gatherroof.txt" \
                  | tail -n 6 ;;
    # D6's gathered and D2's dense hd512 split paths at 4-32 tokens, each split count and the default (run on main
    # and with the row-combine candidate applied), ~2 min
    splitsparse) { timeout 250 python scripts/split_sweep_sparse.py; } 2>&1 | tee "$out/logs/splitsparse.txt" \
                  | tail -n 6 ;;
    # the staged FP8-cache prefill's passes timed alone (scripts/probe_staged.py, D6's two FP8 shapes), ~1.5 min
    staged)   { timeout 200 python scripts/probe_staged.py; } 2>&1 | tee "$out/logs/staged.txt" | tail -n 20 ;;
    # the fused merge (git am docs/tuning/candidates/d7_fused_merge.patch first; measured lost, session 40): B1 / B2 / B4 H64 with it and with the
    # combine launch, alternating, ~2 min
    d7fused)  { timeout 250 python scripts/probe_d7.py --shapes 0,2x64x128x512,4x64x128x512 \
                  --variants full,no_fused_merge,full,no_fused_merge; } 2>&1 | tee "$out/logs/d7fused.txt" | tail -n 6 ;;
    # where B1's partial store goes (session 40: 3.6 of 13 µs): no store / half the bytes / all, B1 and B2 H64, ~1.5 min
    d7store)  { timeout 200 python scripts/probe_d7.py --shapes 0,2x64x128x512 \
                  --variants full,no_partial_store,half_partial_store,full,half_partial_store; } 2>&1 \
                  | tee "$out/logs/d7store.txt" | tail -n 7 ;;
    # D7's B1 / B2 split decodes merged by the chunk combine (shipped) or the row combine, device and host µs, ~2 min
    # the candidate ALTERNATE_HALF_TILES (git apply docs/tuning/candidates/d7_alternate_half_tiles.patch first): its
    # GPU tests (bit-equal to the shipped crossover; with and without its early records), then B1 / B64 / B128 H128 and
    # the H128 prefill, alternating, ~5 min
    d7alt)    { timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -k candidate tests/test_d7_fp8_decode.py;
                timeout 250 python scripts/probe_d7.py --shapes 1x128x128x1024,3,4,4096x128x128x1024 \
                  --variants full,alternate,alternate_early,full,alternate,alternate_early; } 2>&1 \
                  | tee "$out/logs/d7alt.txt" | tail -n 9 ;;
    # why the alternate half-tiles lost (session 42, 10-14 % at H128): the half-tile event traces of the shipped build
    # and of `alternate` at B64 H128 and the H128 prefill (apply docs/tuning/candidates/d7_alternate_half_tiles.patch
    # first), ~2 min
    d7alttrace) { for v in full alternate; do timeout 110 python scripts/probe_d7.py --shapes 3,4096x128x128x1024 \
                  --variants $v --trace; done; } 2>&1 | tee "$out/logs/d7alttrace.txt" | tail -n 40 ;;
    # a gathered split's phases (the split kernel, the combine, both) beside the unsplit call at 32-64 tokens: does
    # the 64-token split win on this GPU (docs/tuning/d2_d6.md session 42: a tie on the H100, expected to win on the
    # H200), ~1 min
    # is the H128 crossover's DSMEM traffic its chain? (session 43) the peer stores removed / halved against the
    # shipped build at B64 / B128 H128 and the H128 prefill, two alternations, ~4 min
    d7peer)   { timeout 320 python scripts/probe_d7.py --shapes 3,4,4096x128x128x1024 \
                  --variants full,no_peer_store,half_peer_store,full,no_peer_store,half_peer_store; } 2>&1 \
                  | tee "$out/logs/d7peer.txt" | tail -n 8 ;;
    # PEER_FP8 (session 43): the H128 crossover shipping e4m3 rows, timed against peer_bf16 (the build before) —
    # the probe first (a hang shows there within its limit; it also asserts peer_bf16 bit-equal to full), then the
    # d7 and sparse GPU test groups only if it passed, ~5 min
    d7peerfp8) { timeout 150 python scripts/probe_d7.py --shapes 1x128x128x1024,3,4,4096x128x128x1024 \
                   --variants full,peer_bf16,full,peer_bf16 2>&1 | tee "$out/logs/d7peerfp8.txt" | tail -n 7 \
                 && [ "${PIPESTATUS[0]}" -eq 0 ] \
                 && { OUT="$out/logs" GROUP_TIMEOUT=300 PARALLEL=2 bash scripts/gpu_check.sh d7 sparse \
                        > "$out/logs/gpu_check.txt" 2>&1; tail -n 5 "$out/logs/gpu_check.txt"; }; } ;;
    # what PEER_FP8's peer rows cost the producer (session 43's open question): their conversion switched off
    # against the shipped build, H128 shapes, two alternations, ~1.5 min
    d7peerparts) { timeout 200 python scripts/probe_d7.py --shapes 3,4,4096x128x128x1024 \
                     --variants full,peer_no_convert,full,peer_no_convert; } 2>&1 \
                     | tee "$out/logs/d7peerparts.txt" | tail -n 8 ;;
    # candidate=a+b: host-path candidates of docs/tuning/candidates/ (a.patch, b.patch) applied to this copy, then the
    # GPU tests of $CAND_TESTS (default the D7 file) matching $CAND_K (default: the decode / prefill reference tests)
    # and the FP8-cache host times
    # hostab=a+b: host µs of the calls the patches touch, main and patched alternately (twice each, one machine),
    # then the rows side by side (scripts/host_ab.py); the patches stay applied after it (~4-5 min)
    hostab=*) run_host_ab $(echo "${w#hostab=}" | tr + ' ') ;;
    candidate=*) run_candidate candidate "${CAND_K:-matches_the_reference or views or one_compiled_call}" \
                   $(echo "${w#candidate=}" | tr + ' ') ;;
    # clustersweep: the gathered split at 2 / 4 / 8 splits as one cluster (no combine) beside split + combine and
    # unsplit, and the D7 split sweep with and without clusters, FlashMLA beside (~3 min)
    clustersweep)
              { timeout 200 python scripts/probe_split_phases.py --tokens 64,48,32 --keys 640,1152 --splits 2,4 \
                    --no-twice --cluster 2,4,8
                timeout 250 python scripts/bench_d7.py --shapes 0,1,5 --splits 2,4,8,10 --cluster-splits 2,4,8 \
                    --no-bf16; } 2>&1 | tee "$out/logs/clustersweep.txt" | grep -v "^\s*$" | tail -n 30 ;;
    splitphases) { timeout 200 python scripts/probe_split_phases.py --tokens 64,48,32 --keys 640,1152 --splits 2 \
                  --no-twice; } 2>&1 | tee "$out/logs/splitphases.txt" | tail -n 7 ;;
    combinerows) { timeout 250 python scripts/probe_combine_rows.py; } 2>&1 | tee "$out/logs/combinerows.txt" | tail -n 12 ;;
    d7slots)  { timeout 200 python scripts/probe_d7.py --shapes 3,4,4096x128x128x1024 \
                  --variants full,two_slots,two_slots_late_ring,full,two_slots_late_ring; } 2>&1 | tee "$out/logs/d7slots.txt" | tail -n 8 ;;
    # why two half-tiles ahead loses at the decode (B64 H128) and not at the prefill: the half-tile event traces of
    # the shipped build and of two_slots (apply docs/tuning/candidates/d7_two_slots.patch first), ~2 min
    d7slotstrace) { for v in full two_slots; do timeout 110 python scripts/probe_d7.py --shapes 3,4096x128x128x1024 \
                  --variants $v --trace; done; } 2>&1 | tee "$out/logs/d7slotstrace.txt" | tail -n 40 ;;
    ncu1)     run_ncu d1 2 scripts/ncu_d1.py 64 ;;
    # ncu1=256,0: another D1 head dim and mask (D,CAUSAL), ours then FA4
    ncu1=*)   run_ncu "d1_$(echo "${w#ncu1=}" | tr , _)" 2 scripts/ncu_d1.py $(echo "${w#ncu1=}" | tr , ' ') ;;
    # ncu1v=128,0,persistent=0+dynamic_schedule=0: also that variant of our build (sweep_d1's knobs, '+' between them)
    ncu1v=*)  set -- $(echo "${w#ncu1v=}" | tr , ' '); run_ncu "d1v_$1_$2" 3 scripts/ncu_d1.py "$1" "$2" "$3" ;;
    ncu6)     run_ncu d6 2 scripts/ncu_d6.py 15 ;;
    # trace6: D6's bf16 prefill with a clock stamp at every half-tile pipeline event (probe_d6.py --trace): Sq 4096
    # H64 and H128 on the 32 MiB pool (D6's L2 pool), then Sq 4096 H64 on 256 MiB — where #36's time goes, pair by pair,
    # and the bound of a deeper pipeline there (early_release: buffers refilled while still read), never measured on
    # the 32 MiB pool where the worst ratio is read (session 33: +2-3 % on 256 MiB) (~4 min in all)
    trace6)   { timeout 200 python scripts/probe_d6.py --trace 0,2 --pool-rows 32768
                timeout 150 python scripts/probe_d6.py --trace 0 --pool-rows 262144
                timeout 200 python scripts/probe_d6.py --variants full,early_release --pool-rows 32768; } 2>&1 \
                | tee "$out/logs/trace6.txt" | tail -n 50 ;;
    # trace6er: the same traces of early_release (session 54: +0.7 % on the 32 MiB pool): with no wait for a refill,
    # the stamps show the consumers' own chain a pair — softmax and the P exchange between the PVs (~1 min)
    trace6er) { timeout 200 python scripts/probe_d6.py --trace 0,2 --variants early_release,full --pool-rows 32768; } 2>&1 \
                | tee "$out/logs/trace6er.txt" | tail -n 40 ;;
    # items6: D6's fixed cost a CTA (Q load, first gather, epilogue, O store, launch) from a key-count sweep, ours and
    # FlashMLA's (probe_d6_items.py; session 54) — whether a persistent CTA overlapping them is worth building (~2 min)
    items6)   { timeout 200 python scripts/probe_d6_items.py --pool-rows 32768
                timeout 150 python scripts/probe_d6_items.py --pool-rows 32768 --heads 128 --keys 256,640,1152,2304; } 2>&1 \
                | tee "$out/logs/items6.txt" | tail -n 20 ;;
    # lives6: every CTA's life stamped by %globaltimer (probe_d6.py --items: Q landed, first QK, loops done, O stored,
    # exits) and the SM's idle gap between CTAs, Sq 4096 H64 and H128 on the 32 MiB pool (~1 min)
    lives6)   { timeout 200 python scripts/probe_d6.py --items 0,2 --pool-rows 32768; } 2>&1 \
                | tee "$out/logs/lives6.txt" | tail -n 40 ;;
    # prefetch6: the next CTA's Q + index list prefetched into L2 (PREFETCH_NEXT_CTA, session 54) against without,
    # twice each, on the 32 MiB and 256 MiB pools; then the CTA lives and the fixed-cost fit beside FlashMLA (~5 min)
    prefetch6) { timeout 200 python scripts/probe_d6.py --variants full,no_prefetch_next,full,no_prefetch_next --pool-rows 32768
                timeout 200 python scripts/probe_d6.py --variants full,no_prefetch_next --pool-rows 262144
                timeout 100 python scripts/probe_d6.py --items 0 --pool-rows 32768
                timeout 200 python scripts/probe_d6_items.py --pool-rows 32768; } 2>&1 \
                | tee "$out/logs/prefetch6.txt" | tail -n 40 ;;
    # persist6: the persistent D6 build (landed, session 55: full) against one CTA an item (per_item), 2 / 4 an SM, and the
    # first-rows prefetch, on both pools (~5 min cold: five builds an H; `python -u` so a killed run still shows rows)
    persist6) { timeout 270 python -u scripts/probe_d6.py --variants full,per_item,persistent_x2,persistent_x4,prefetch_rows --pool-rows 32768
                timeout 200 python -u scripts/probe_d6.py --variants full,per_item,prefetch_rows --pool-rows 262144; } 2>&1 \
                | tee "$out/logs/persist6.txt" | tail -n 12 ;;
    # clocks6: the SM clock and board power (nvidia-smi, 20 ms) while D6 and FlashMLA replay alone at 640 keys, and
    # the fixed-cost fit at three key counts: is the sustained prefill power-bound? (~1.5 min)
    clocks6)  { timeout 200 python scripts/probe_d6_items.py --pool-rows 32768 --keys 128,640,2560 --clocks 640; } 2>&1 \
                | tee "$out/logs/clocks6.txt" | tail -n 12 ;;
    # ncu6=18: the same on a pool of 2^18 rows (256 MiB: DRAM-bound, L2 86 % busy in session 53)
    ncu6=*)   run_ncu "d6_pool${w#ncu6=}" 2 scripts/ncu_d6.py "${w#ncu6=}" ;;
    # the dequantization's builds, 1 / 2 / 4 slots a warp in flight (d6_dequant_slots landed in session 48): its GPU
    # bit-equality tests, then probe_staged's passes with the dequantization once per build (~2 min; joins: the joins only)
    dqslots)  timeout 200 python -m pytest -q -p no:cacheprovider tests -k "dequant_kernel or list_join" > "$out/logs/pytest_k.txt" 2>&1
              tail -n 3 "$out/logs/pytest_k.txt"
              timeout 200 python scripts/probe_staged.py --dequant-variants 1,2,4 --join-variants 1,4,8 2>&1 | tee "$out/logs/dqslots.txt" | tail -n 30 ;;
    # the list join's entries a thread in flight by graph replay (session 48's 1 / 4 / 8 were timed with the host in
    # them), then each pass of the staged call and the whole call (probe_staged.py, ~2 min)
    joins)    timeout 240 python scripts/probe_staged.py --join-variants 1,2,4,8 2>&1 | tee "$out/logs/joins.txt" | tail -n 30 ;;
    # the staged FP8-cache prefill's dequantization (both caches, every page) and list joins (scripts/ncu_staged.py)
    ncustaged) run_ncu staged 4 scripts/ncu_staged.py ;;
    bench)    { timeout 120 python scripts/bench_sparse.py; timeout 60 python scripts/bench_nvfp4.py;
                timeout 120 python scripts/quick_bench.py 64 128 256; } 2>&1 | grep "{" > "$out/logs/bench.txt"
              cat "$out/logs/bench.txt" ;;
    # a target list is space-separated: "persist6,clocks6" matched nothing and the call did nothing (session 55)
    *)        echo "gpu_session.sh: unknown target '$w' (targets are space-separated; commas only inside pipeline=...)" ;;
  esac
done
# the stage reports and figures come back too (a few MB): what a person looks at
tar czf "$out/session.tgz" stages/results stages/gpu_tests STATUS.md runs/*/*.log runs/*/*.json runs/*/*.html \
    runs/*/figures -C "$out" logs 2>/dev/null
rm -rf "$out/logs"
ls -la "$out"
[ -n "$stamp_warning" ] && echo "$stamp_warning"
exit 0
