#!/usr/bin/env bash
# Build a program with the templates of an earlier commit, to time it beside today's build
# (bench/probe.py --lib OUT.so:ENTRY). Runs where the repository's history is (the GPU
# machine's tree arrives without .git): build here, carry the library in .device-in/.
#
#   bash bench/build_at.sh 7e22b9d bench/programs/decode/nk_16x64x128_swap_s8_atomic1.l2 .device-in/old/p.so
#
# The library's entry symbol is renamed l2gen_at_<commit>_<hash> so that it never collides
# with today's build of the same program in one process; the last line printed is the
# --lib argument.
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: bash bench/build_at.sh COMMIT PROGRAM.l2 OUT.so" >&2
  exit 2
fi
ref=$1 program=$(realpath "$2") out=$3
top=$(git rev-parse --show-toplevel)
sha=$(git -C "$top" rev-parse --short "$ref")
work=$(mktemp -d)
trap 'git -C "$top" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$top" worktree add --detach "$work/tree" "$sha" >/dev/null
(cd "$work/tree" && PYTHONPATH="$work/tree" python3 -m l2gen.cli compile "$program" -o "$work/cu" >/dev/null)
cu=$(ls "$work"/cu/*.cu)
sed -i "s/l2gen_sm\(80\|90a\)_\(l2gen_\)\?/l2gen_at_${sha}_/g" "$cu"
# the same flags as the build at that commit wrote for it (its .nvcc.sh), to this output
cmd=$(grep -v '^#' "$work"/cu/*.nvcc.sh | grep nvcc | head -1)
cmd=${cmd//"$work/cu/"/}
cmd=$(printf '%s' "$cmd" | sed -E "s#-o [^ ]+#-o $work/lib.so#")
(cd "$work/cu" && eval "$cmd")
mkdir -p "$(dirname "$out")"
cp "$work/lib.so" "$out"
entry=$(nm -D "$out" | awk '/ T l2gen_at_/ && !/_(workspace|program|trace|mark|marks|trace_reset)$/ && !e {e = $3} END {print e}')
echo "$out:$entry"
