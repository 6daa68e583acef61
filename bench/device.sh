#!/usr/bin/env bash
# Everything one GPU-machine call needs, in one command: install the carried wheels, then
# run the named steps in order (info sample gputests bench bench2 tune). Results go under $OUT (the device tool's folder) or ./out.
#
#   bash bench/device.sh info gputests bench      # steps: info sample gputests bench tune
#
# Knobs (environment): SAMPLE_COUNT, SAMPLE_SEED, SAMPLE_BUNDLE, BENCH_PROGRAMS,
# BENCH_SUITE, BENCH_REPS, TUNE_ARGS. Carry `.whl` (lark, nvidia-cutlass wheels) and,
# to reuse libraries built elsewhere, `.l2cache`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
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
L2GEN="python3 -m l2gen.cli"
status=0

for step in "$@"; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
      nvcc --version | tail -2
      python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
      ;;
    sample)
      timeout "${SAMPLE_TIMEOUT:-550}" $L2GEN sample --count "${SAMPLE_COUNT:-200}" \
        --seed "${SAMPLE_SEED:-1}" --bundle "${SAMPLE_BUNDLE:-1}" -o "$OUT/sample.json" \
        2> "$OUT/sample.log" || status=1
      tail -3 "$OUT/sample.log"
      ;;
    gputests)
      # shellcheck disable=SC2086
      timeout "${GPUTESTS_TIMEOUT:-400}" python3 -m pytest ${GPUTESTS:-tests/gpu} -v -rs --durations=8 \
        -p no:cacheprovider 2>&1 | tee "$OUT/gputests.log" | tail -40
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
      ;;
    bench|bench2)
      # bench2 is a second, independent run: its ratios are compared with the first's.
      # shellcheck disable=SC2086
      timeout "${BENCH_TIMEOUT:-400}" $L2GEN bench ${BENCH_PROGRAMS:-examples/*.l2} \
        --suite "${BENCH_SUITE:-suites/public.json}" --reps "${BENCH_REPS:-50}" -o "$OUT/$step.json" \
        2> >(tee "$OUT/$step.log" >&2) || status=1
      ;;
    tune)
      # shellcheck disable=SC2086
      $L2GEN tune ${TUNE_ARGS:---suite suites/public.json --budget 16} --db "$OUT/tune.db" || status=1
      ;;
    *)
      echo "unknown step '$step' (info sample gputests bench tune)" >&2
      exit 2
      ;;
  esac
done
exit $status
