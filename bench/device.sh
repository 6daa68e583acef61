#!/usr/bin/env bash
# Everything one GPU-machine call needs, in one command: install the carried wheels, then
# run the named steps in order. Results go to $RESULTS (default /tmp/l2gen-results) and,
# packed as results.tgz, to $OUT (the device tool's folder, which takes back few files) or ./out.
#
#   bash bench/device.sh info gputests bench bench2 compare
#   bash bench/device.sh llm llm2 llmcompare graph server
#   bash bench/device.sh tune-random tune-embedded shipdb dbbench dispatch pack
#   bash bench/device.sh info e2e
#   L2GEN_COMMIT=<sha> bash bench/device.sh info buildtime
#
# Every bench step times under an L2 protocol (BENCH_L2, default clean: a read pass over
# 4x the L2 before each run; dirty: the written flush every result before it used) and
# records it, with the launch floor, stream rate and peak it measured, in its results.
# Every l2gen command targets the card the machine has (L2GEN_GPU=h200|h100|a100 to say
# otherwise): results name it, and the database steps fill kernels_<gpu>.db.
#
# Steps:
#   info           GPU, driver, nvcc, torch
#   clusters       how many thread block clusters of 1, 2, 4, 8 CTAs the GPU holds at once
#                  (one and two 384-thread CTAs per SM); $RESULTS/clusters.txt
#   sample         compile SAMPLE_COUNT random programs (SAMPLE_SEED, SAMPLE_BUNDLE)
#   gputests       pytest $GPUTESTS (default tests/gpu; log $GPUTESTS_NAME.log, default gputests)
#   bench, bench2  the example programs (BENCH_PROGRAMS) x the suite, BENCH_REPS timed runs
#                  in each of BENCH_ROUNDS rounds; bench2 is a second, independent run;
#                  'compare' says which ratios reproduce between them (files named
#                  $BENCH_NAME-bench.json, ... when BENCH_NAME is set); BENCH_SUSTAINED=MS also
#                  times every program and baseline back to back in rotated blocks of MS ms
#   llm, llm2      the baselines alone on $LLM_SUITE (suites/llm.json: nn.Linear shapes, B
#                  stored N x K), twice; 'llmcompare' says which baseline ratios reproduce
#   graph          the example programs on $MODES_SUITE (suites/modes.json) in graph mode:
#                  calls back to back in one CUDA graph over rotated inputs
#                  (GRAPH_CALLS most per graph; results named $GRAPH_NAME, default graph)
#   server         the same in server mode: Poisson arrivals at QPS (100) calls per second,
#                  SERVER_REPS (30) calls per runner, event and wall time per call
#   tune-random, tune-embedded
#                  l2gen tune on the suite, TUNE_BUDGET candidates per shape, TUNE_PARALLEL
#                  shapes at once, TUNE_BUNDLE programs per nvcc run; databases, curves and
#                  the policy state land in $RESULTS (a database in .device-in/ of the same
#                  name is copied there first, so a cut-short tune resumes)
#                  (TUNE_LIBRARY=SHARE: the kernel library's knob settings take up to that share of
#                  each shape's budget first; run the library step before)
#   library        l2gen build --library with LIBRARY_JOBS (16) nvcc jobs: the wall time of building
#                  the kernel library shipped for the GPU, on its own
#   shipdb         merge the tuned databases (and the databases in $SHIP_FROM, the bench
#                  results files in $SHIP_BENCH) into $RESULTS/kernels_$L2GEN_GPU.db (the GPU: L2GEN_GPU,
#                  default the card this machine has)
#   dbtop          bench each shape's TOP (3) best programs of $TOP_DB afresh (TOP_SUITE: only
#                  the shapes of that suite; results named
#                  $DBTOP_NAME, default dbtop)
#   dbbench        bench each shape's best program of $DB (default the shipped one) in a
#                  fresh process; compare it with the database's records (refused, exit 2,
#                  unless BENCH_L2 is the database's protocol: the shipped one is clean)
#   dispatch       l2gen bench-dispatch: the dispatcher over $DB against torch.matmul
#                  (results named $DISPATCH_NAME, default dispatch)
#   overhead       bench/host_overhead.py on the GPU: the host time a call adds to torch.matmul's
#                  (unserved shapes, and --served: a winner serving fresh tensors every call,
#                  a CUTLASS one, with and without the bound-call helper, and an l2gen decode one)
#   e2e            bench/e2e_llama.py: a Llama-3.1-8B-sized model of E2E_LAYERS (2) layers, random
#                  weights, with and without l2gen.patch, eager and under CUDA graphs: greedy
#                  decode at batch 1, 16, 64 and a 2048-token prefill (E2E_ARGS: more options;
#                  E2E_DB: the kernel database l2gen serves from, default the shipped one);
#                  $RESULTS/$E2E_NAME.json (e2e), also copied to $OUT
#   probe          bench/probe.py on each of PROBE_SHAPES (MxNxK, space-separated): the
#                  PROBE_PROGRAMS (DSL files) with PROBE_ARGS (e.g. "--define
#                  MACRO=1", "--decompositions heuristic,stream_k"), round-robin
#                  in one process, PROBE_REPS (30) each; $RESULTS/$PROBE_NAME.txt (probe)
#   timeline       bench/timeline.py on each of TIMELINE_SHAPES: TIMELINE_PROGRAMS (impl l2gen
#                  DSL files, built again with -DL2GEN_TRACE) block by block, with
#                  TIMELINE_ARGS (e.g. "--splits 1,2"), TIMELINE_REPS (15) launches each;
#                  $RESULTS/$TIMELINE_NAME.txt (timeline)
#   anatomy        bench/launch_anatomy.py: a tiny GEMM's launch piece by piece (empty kernels
#                  differing in one launch property, loads and stores alone, a bare mma.sync
#                  GEMM) beside torch.matmul and ANATOMY_PROGRAMS on ANATOMY_SHAPES;
#                  $RESULTS/$ANATOMY_NAME.txt, .json (anatomy)
#   pack           the built libraries of $DB's programs as $OUT/libs.tar.xz (carry it back
#                  as .device-in/libs.tar.xz to skip rebuilding them in a later call)
#   buildtime      cold builds of every example (bench/build_times.py): all at once with 16
#                  nvcc processes, then one at a time (BUILDTIME_JOBS, default "16 1"),
#                  BUILDTIME_ROUNDS times (1); wall and CPU time in $RESULTS/$BUILDTIME_NAME.json
#                  (build-times). BUILDTIME_BASELINE: sources of an earlier commit to time
#                  alongside, e.g. bench/build-baseline-3fbf34e.json (then BUILDTIME_JOBS=16
#                  fits in one call)
#
# Carry `.whl` (lark, nvidia-cutlass and test wheels: bash bench/fetch_wheels.sh), `.l2cache`
# (libraries built elsewhere) and `.device-in` (inputs from an earlier call, or made here:
# libs.tar.xz from `l2gen build FILES --pack .device-in/libs.tar.xz`, *.db).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
RESULTS=${RESULTS:-/tmp/l2gen-results}
mkdir -p "$OUT" "$RESULTS"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
# The tree arrives without .git: the caller passes the commit it was sent from.
export L2GEN_COMMIT=${L2GEN_COMMIT:-}
export L2GEN_CACHE_DIR=${L2GEN_CACHE_DIR:-$PWD/.l2cache}
if [ -f .device-in/libs.tar.xz ]; then
  mkdir -p "$L2GEN_CACHE_DIR" && tar xJf .device-in/libs.tar.xz -C "$L2GEN_CACHE_DIR"
fi
# The GPU every l2gen command targets: the card this machine has (L2GEN_GPU overrides), so
# that a run on a lent H100 names the H100 in its results and fills a database of its own.
if [ -z "${L2GEN_GPU:-}" ]; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H100*) L2GEN_GPU=h100 ;;
    *A100*) L2GEN_GPU=a100 ;;
    *) L2GEN_GPU=h200 ;;
  esac
fi
export L2GEN_GPU
L2GEN="python3 -m l2gen.cli --gpu $L2GEN_GPU"
# The kernel library the library and tune steps use: the one shipped for the card, else the
# H200's (sm90a configurations; the H100 has the same SMs and shared memory).
LIBRARY=${LIBRARY:-l2gen/data/library/$L2GEN_GPU}
[ -d "$LIBRARY" ] || LIBRARY=l2gen/data/library/h200
SUITE=${SUITE:-suites/public.json}
DB=${DB:-$RESULTS/kernels_$L2GEN_GPU.db}
status=0

# per_shape SCRIPT FILE SHAPES TIMEOUT REPS PROGRAMS ARGS: SCRIPT (bench/probe.py or
# bench/timeline.py) once per shape of SHAPES over the PROGRAMS, all output into FILE; a run
# that fails or times out marks the step failed and the next shape goes on.
per_shape() {
  local script=$1 file=$2 shapes=$3 limit=$4 reps=$5 programs=$6 args=$7 shape
  : > "$file"
  for shape in $shapes; do
    echo "== $shape" >> "$file"
    # shellcheck disable=SC2086
    timeout "$limit" python3 "$script" $programs $args --shape "$shape" --reps "$reps" >> "$file" 2>&1 || status=1
  done
}

pack_results() {
  tar czf "$OUT/results.tgz" -C "$RESULTS" . && ls -la "$RESULTS"
}
trap pack_results EXIT

for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
      nvcc --version | tail -2
      python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
      ;;
    clusters)
      # how many thread block clusters of 1, 2, 4, 8 CTAs the GPU holds at once, at one and at
      # two CTAs of 384 threads per SM: a one-wave launch of more clusters runs in two
      python3 -c "
from l2gen.probes import Probes, build_probes
p = Probes(build_probes())
for smem, per in ((200 * 1024, 'one CTA per SM (200 KB)'), (100 * 1024, 'two CTAs per SM (100 KB)')):
    print('max active clusters,', per + ':', ', '.join(f'{c} CTAs: {p.max_active_clusters(c, 384, smem)}' for c in (1, 2, 4, 8)))
" 2>&1 | tee "$RESULTS/clusters.txt" || status=1
      ;;
    sample)
      timeout "${SAMPLE_TIMEOUT:-550}" $L2GEN sample --count "${SAMPLE_COUNT:-200}" \
        --seed "${SAMPLE_SEED:-1}" --bundle "${SAMPLE_BUNDLE:-1}" -o "$RESULTS/sample.json" \
        2> "$RESULTS/sample.log" || status=1
      tail -3 "$RESULTS/sample.log"
      ;;
    gputests)
      # shellcheck disable=SC2086
      timeout "${GPUTESTS_TIMEOUT:-400}" python3 -m pytest ${GPUTESTS:-tests/gpu} -v -rs --durations=8 \
        -p no:cacheprovider 2>&1 | tee "$RESULTS/${GPUTESTS_NAME:-gputests}.log" | tail -40
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
      ;;
    bench|bench2)
      name=${BENCH_NAME:+$BENCH_NAME-}$step
      # shellcheck disable=SC2086
      timeout "${BENCH_TIMEOUT:-400}" $L2GEN bench ${BENCH_PROGRAMS:-examples/*.l2} \
        --suite "$SUITE" --reps "${BENCH_REPS:-50}" --rounds "${BENCH_ROUNDS:-4}" --l2 "${BENCH_L2:-clean}" \
        ${BENCH_SUSTAINED:+--sustained "$BENCH_SUSTAINED"} \
        -o "$RESULTS/$name.json" 2> "$RESULTS/$name.log" > "$RESULTS/$name.txt" || status=1
      tail -30 "$RESULTS/$name.txt"
      ;;
    compare)
      name=${BENCH_NAME:+$BENCH_NAME-}
      $L2GEN compare "$RESULTS/${name}bench.json" "$RESULTS/${name}bench2.json" -o "$RESULTS/${name}compare.json" || status=1
      ;;
    llm|llm2)
      # no programs: the five baselines alone; the suite's "b": "nk" sets the B layout
      timeout "${BENCH_TIMEOUT:-400}" $L2GEN bench --suite "${LLM_SUITE:-suites/llm.json}" \
        --reps "${BENCH_REPS:-50}" --rounds "${BENCH_ROUNDS:-4}" --l2 "${BENCH_L2:-clean}" --no-plot \
        -o "$RESULTS/$step.json" 2> "$RESULTS/$step.log" > "$RESULTS/$step.txt" || status=1
      tail -50 "$RESULTS/$step.txt"
      ;;
    llmcompare)
      $L2GEN compare "$RESULTS/llm.json" "$RESULTS/llm2.json" -o "$RESULTS/llmcompare.json" || status=1
      ;;
    graph)
      # shellcheck disable=SC2086
      timeout "${BENCH_TIMEOUT:-400}" $L2GEN bench ${BENCH_PROGRAMS:-examples/*.l2} --suite "${MODES_SUITE:-suites/modes.json}" \
        --mode graph --graph-calls "${GRAPH_CALLS:-100}" --l2 "${BENCH_L2:-clean}" --reps "${BENCH_REPS:-50}" \
        -o "$RESULTS/${GRAPH_NAME:-graph}.json" 2> "$RESULTS/${GRAPH_NAME:-graph}.log" \
        > "$RESULTS/${GRAPH_NAME:-graph}.txt" || status=1
      tail -30 "$RESULTS/${GRAPH_NAME:-graph}.txt"
      ;;
    server)
      # shellcheck disable=SC2086
      timeout "${BENCH_TIMEOUT:-400}" $L2GEN bench ${BENCH_PROGRAMS:-examples/*.l2} --suite "${MODES_SUITE:-suites/modes.json}" \
        --mode server --qps "${QPS:-100}" --seed "${SERVER_SEED:-0}" --l2 "${BENCH_L2:-clean}" --reps "${SERVER_REPS:-30}" \
        -o "$RESULTS/server.json" 2> "$RESULTS/server.log" > "$RESULTS/server.txt" || status=1
      tail -60 "$RESULTS/server.txt"
      ;;
    library)
      # the kernel library shipped for the GPU, built with 16 nvcc jobs: its wall time alone
      start=$(date +%s)
      timeout "${LIBRARY_TIMEOUT:-580}" $L2GEN build --library "$LIBRARY" -j "${LIBRARY_JOBS:-16}" \
        > "$RESULTS/library-build.txt" 2> "$RESULTS/library-build.log" || status=1
      echo "library build: $(( $(date +%s) - start )) s wall, $(grep -c '\.so$' "$RESULTS/library-build.txt") libraries" \
        | tee -a "$RESULTS/library-build.txt"
      ;;
    tune-random|tune-embedded)
      policy=${step#tune-}
      if [ -f ".device-in/tune-$policy.db" ] && [ ! -f "$RESULTS/tune-$policy.db" ]; then
        cp ".device-in/tune-$policy.db" "$RESULTS/"
        if [ "$policy" = embedded ] && [ -f .device-in/policy_$L2GEN_GPU.json ]; then
          cp .device-in/policy_$L2GEN_GPU.json "$RESULTS/"
        fi
      fi
      extra=()
      if [ -n "${TUNE_LIBRARY:-}" ]; then  # the library's knob settings first (build it first: the library step)
        extra+=(--library "$LIBRARY" --library-share "${TUNE_LIBRARY}")
      fi
      if [ "$policy" = embedded ]; then
        batch=${TUNE_BATCH:-4}
        extra+=(--policy-state "$RESULTS/policy_$L2GEN_GPU.json")
      else
        batch=${TUNE_BATCH_RANDOM:-8}  # the random policy learns nothing: one batch per shape
      fi
      # SIGINT at the time limit: tune stops cleanly (in-flight batches land, the policy
      # state and the curves are written); rerunning with the same database resumes.
      timeout -s INT -k 90 "${TUNE_TIMEOUT:-580}" $L2GEN tune --suite "$SUITE" --budget "${TUNE_BUDGET:-8}" \
        --batch "$batch" --parallel "${TUNE_PARALLEL:-6}" --bundle "${TUNE_BUNDLE:-2}" \
        --policy "$policy" --seed "${TUNE_SEED:-1}" --l2 "${BENCH_L2:-clean}" "${extra[@]}" \
        --db "$RESULTS/tune-$policy.db" --curves "$RESULTS/curves-$policy.json" \
        2> "$RESULTS/tune-$policy.log" | tee "$RESULTS/tune-$policy.txt" || status=1
      grep -c "build.*FAILED\|Traceback" "$RESULTS/tune-$policy.log"
      ;;
    shipdb)
      rm -f "$RESULTS/kernels_$L2GEN_GPU.db"
      for src in "$RESULTS"/tune-*.db ${SHIP_FROM:-}; do
        [ -f "$src" ] || continue
        $L2GEN db export --db "$src" "$RESULTS/export.json" >/dev/null && \
          $L2GEN db import --db "$RESULTS/kernels_$L2GEN_GPU.db" "$RESULTS/export.json" || status=1
      done
      rm -f "$RESULTS/export.json"
      for results in ${SHIP_BENCH:-}; do  # bench results files: their measured rows count too
        $L2GEN db import-bench --db "$RESULTS/kernels_$L2GEN_GPU.db" "$results" || status=1
      done
      $L2GEN db show --db "$RESULTS/kernels_$L2GEN_GPU.db" || status=1
      ;;
    dbtop)
      # each shape's TOP best programs of $TOP_DB (default the shipped database), measured
      # afresh: bench rows that shipdb can import (SHIP_BENCH) to rebuild a database
      name=${DBTOP_NAME:-dbtop}
      timeout "${BENCH_TIMEOUT:-400}" $L2GEN bench --db "${TOP_DB:-l2gen/data/kernels_$L2GEN_GPU.db}" --top "${TOP:-3}" \
        ${TOP_SUITE:+--suite "$TOP_SUITE"} --reps "${BENCH_REPS:-50}" --rounds "${BENCH_ROUNDS:-4}" --l2 "${BENCH_L2:-clean}" -o "$RESULTS/$name.json" \
        2> "$RESULTS/$name.log" > "$RESULTS/$name.txt" || status=1
      tail -28 "$RESULTS/$name.txt"
      ;;
    dbbench)
      timeout "${BENCH_TIMEOUT:-400}" $L2GEN bench --db "$DB" --reps "${BENCH_REPS:-50}" --rounds "${BENCH_ROUNDS:-4}" \
        --l2 "${BENCH_L2:-clean}" -o "$RESULTS/dbbench.json" \
        2> "$RESULTS/dbbench.log" > "$RESULTS/dbbench.txt" || status=1
      tail -28 "$RESULTS/dbbench.txt"
      $L2GEN compare --db "$DB" "$RESULTS/dbbench.json" --all -o "$RESULTS/dbcompare.json" || status=1
      ;;
    dispatch)
      timeout "${DISPATCH_TIMEOUT:-300}" $L2GEN bench-dispatch --db "$DB" --suite "$SUITE" --l2 "${BENCH_L2:-clean}" \
        -o "$RESULTS/${DISPATCH_NAME:-dispatch}.json" \
        2> "$RESULTS/${DISPATCH_NAME:-dispatch}.log" || status=1
      ;;
    overhead)
      # host time per call on 8 x 8 operands: no database (every call falls back), a
      # database whose one winner serves another shape (the unserved path), with and
      # without out=, one whose winner (a CUTLASS sm90a program, built here) serves the
      # timed shape, on fresh tensors every call, and one whose winner is an l2gen decode
      # program (B stored N x K, called as a patched nn.Linear calls it); the served CUTLASS
      # rows again with --direct: every entry argument through ctypes, the path where the
      # bound-call helper (l2gen/bound.py) cannot be built
      decode="--served --shape 64x4096x4096 --program bench/programs/decode/nk_32x64x128_swap_s8_atomic1.l2"
      for flags in "" "--winner" "--winner --no-out" "--served" "--served --no-out" "--served --direct" \
                   "--served --no-out --direct" "$decode" "$decode --no-out"; do
        echo "-- host_overhead.py --device cuda $flags"
        # shellcheck disable=SC2086
        python3 bench/host_overhead.py --device cuda $flags || status=1
      done 2>&1 | tee "$RESULTS/overhead.txt"
      ;;
    e2e)
      name=${E2E_NAME:-e2e}
      db=()
      [ -n "${E2E_DB:-}" ] && db=(--db "$E2E_DB")
      # shellcheck disable=SC2086
      timeout "${E2E_TIMEOUT:-400}" python3 bench/e2e_llama.py --layers "${E2E_LAYERS:-2}" "${db[@]}" ${E2E_ARGS:-} \
        --out "$RESULTS/$name.json" 2> "$RESULTS/$name.log" | tee "$RESULTS/$name.txt"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
      tail -5 "$RESULTS/$name.log"
      cp "$RESULTS/$name.json" "$OUT/" 2>/dev/null || echo "e2e: no results JSON (see $name.log)"
      ;;
    probe)
      name=${PROBE_NAME:-probe}
      per_shape bench/probe.py "$RESULTS/$name.txt" "${PROBE_SHAPES:?PROBE_SHAPES: the shapes to probe}" \
        "${PROBE_TIMEOUT:-200}" "${PROBE_REPS:-30}" "${PROBE_PROGRAMS:?PROBE_PROGRAMS: DSL files}" "${PROBE_ARGS:-}"
      grep -v ": relerr" "$RESULTS/$name.txt"  # the timings; the verified settings stay in the file
      cp "$RESULTS/$name.txt" "$OUT/" 2>/dev/null
      ;;
    timeline)
      name=${TIMELINE_NAME:-timeline}
      per_shape bench/timeline.py "$RESULTS/$name.txt" "${TIMELINE_SHAPES:?TIMELINE_SHAPES: the shapes to trace}" \
        "${TIMELINE_TIMEOUT:-200}" "${TIMELINE_REPS:-15}" "${TIMELINE_PROGRAMS:?TIMELINE_PROGRAMS: DSL files}" "${TIMELINE_ARGS:-}"
      cat "$RESULTS/$name.txt"
      cp "$RESULTS/$name.txt" "$OUT/" 2>/dev/null
      ;;
    anatomy)
      name=${ANATOMY_NAME:-anatomy}
      # shellcheck disable=SC2086
      timeout "${ANATOMY_TIMEOUT:-300}" python3 bench/launch_anatomy.py ${ANATOMY_PROGRAMS:-} \
        ${ANATOMY_SHAPES:+--shapes "$ANATOMY_SHAPES"} --reps "${ANATOMY_REPS:-30}" \
        --json "$RESULTS/$name.json" > "$RESULTS/$name.txt" 2>&1 || status=1
      grep -v ": relerr" "$RESULTS/$name.txt"
      cp "$RESULTS/$name.txt" "$RESULTS/$name.json" "$OUT/" 2>/dev/null
      ;;
    pack)
      python3 bench/pack_libs.py "$DB" "$OUT/libs.tar.xz" || status=1
      ;;
    buildtime)
      baseline=()
      [ -n "${BUILDTIME_BASELINE:-}" ] && baseline=(--baseline "$BUILDTIME_BASELINE")
      # shellcheck disable=SC2086
      timeout "${BUILDTIME_TIMEOUT:-580}" python3 bench/build_times.py --jobs ${BUILDTIME_JOBS:-16 1} \
        --rounds "${BUILDTIME_ROUNDS:-1}" "${baseline[@]}" -o "$RESULTS/${BUILDTIME_NAME:-build-times}.json" \
        2> "$RESULTS/${BUILDTIME_NAME:-build-times}.log" || status=1
      tail -12 "$RESULTS/${BUILDTIME_NAME:-build-times}.log"
      ;;
    *)
      echo "unknown step '$step' (see the steps at the top of bench/device.sh)" >&2
      exit 2
      ;;
  esac
done
exit $status
