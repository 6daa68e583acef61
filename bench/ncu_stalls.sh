#!/usr/bin/env bash
# Where the warps of an l2gen kernel and of cuBLAS's kernel for the same problem wait:
# ncu's duration, throughput and per-reason stall ratios (warps stalled per issued
# instruction) for one launch of each, caches flushed before each (as l2gen bench's clean
# protocol leaves them cold). Needs bench/probe.py's dependencies and ncu on PATH.
#
#   bash bench/ncu_stalls.sh PROGRAM.l2 MxNxK [SPLITS]
set -euo pipefail
program=$1 shape=$2 splits=${3:-1}
metrics="gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",launch__grid_size,launch__cluster_dim_x,smsp__warps_issue_stalled_no_instruction.sum"
metrics+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
metrics+=${NCU_METRICS:+,$NCU_METRICS}   # more, comma-separated
ncu --clock-control none --cache-control all --metrics "$metrics" -k regex:'gemm_kernel|device_kernel|gemv|nvjet|sm90_xmma|cutlass' \
  python3 bench/probe.py "$program" --shape "$shape" --splits "$splits" --once 2>&1 |
  grep -vE '^==PROF==|^ +-{8}|Section:|Metric Name' |
  awk '!/^    [a-z]/ || ($NF != "0" && $NF != "0.00")'   # metric rows that are not zero
