#!/usr/bin/env bash
# What tracing through `ulnet fsstudy trace` costs: each workload run untraced and traced
# (the FUSE pass-through mounted over its directory, `-- COMMAND` mode), side by side in
# alternating order, ROUNDS times; the medians and their ratio go to bench/results/.
#
# usage: bench/fsstudy-overhead.sh            (ROUNDS=5 WORK=/tmp/fsstudy-overhead by default)
# Needs root and /dev/fuse, gcc, and the sources of two real C projects as crates.io ships
# them (lua-src: Lua 5.1-5.4; libz-sys: zlib), fetched with cargo when missing.
#
# Workloads (each timed inside the command, so mounting and finishing the trace file are
# not counted; both variants run the same script in the same directory):
#   metadata      untar lua-src and libz-sys (about 470 files) and build them: every C file
#                 compiled (cc -O1, two at a time), a library per Lua version and zlib,
#                 and a program linked against each Lua library and run
#   stream-warm   two 1 GiB files read with 1 MiB reads, from the page cache
#   stream-cold   the same after the files' pages are dropped (dd iflag=nocache), so the
#                 disk serves them
# Run it under `flock /work/bench.lock` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
WORK=${WORK:-/tmp/fsstudy-overhead}
ULNET=${ULNET:-$PWD/target/release/ulnet}
OUT=${OUT:-bench/results/fsstudy-overhead.txt}
[ -x "$ULNET" ] || cargo build --release --locked -p ulnet
[ "$(id -u)" = 0 ] && [ -e /dev/fuse ] || { echo "needs root and /dev/fuse" >&2; exit 2; }

crate() { ls "$HOME"/.cargo/registry/cache/*/"$1"-*.crate 2>/dev/null | sort -V | tail -1; }
if [ -z "$(crate lua-src)" ] || [ -z "$(crate libz-sys)" ]; then
  fetch=$(mktemp -d)
  mkdir "$fetch/src" && echo 'fn main() {}' >"$fetch/src/main.rs"
  printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nlua-src = "547"\nlibz-sys = "1"\n[workspace]\n' >"$fetch/Cargo.toml"
  (cd "$fetch" && cargo fetch -q)
fi
LUA=$(crate lua-src)
ZLIB=$(crate libz-sys)

rm -rf "$WORK" && mkdir -p "$WORK/metadata" "$WORK/stream"
for i in 1 2; do head -c $((1 << 30)) /dev/urandom >"$WORK/stream/big-$i.bin"; done

# The crate ships each Lua's library sources without its interpreter: a small program that
# runs a chunk through the library stands in for it.
cat >"$WORK/driver.c" <<'EOF'
#include "lua.h"
#include "lauxlib.h"
#include "lualib.h"
int main(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  int failed = luaL_dostring(L, "local t = {} for i = 1, 1000 do t[i] = i * i end return #t");
  lua_close(L);
  return failed;
}
EOF

# The workloads, each a script run in its directory that writes its nanoseconds to $2.
cat >"$WORK/metadata.sh" <<EOF
set -e
t0=\$(date +%s%N)
rm -rf build && mkdir build && cd build
tar xzf "$LUA" && tar xzf "$ZLIB"
for v in lua-src-*/lua-5.*; do
  ls "\$v"/*.c | xargs -P2 -n8 cc -O1 -DLUA_USE_POSIX -c
  ar rcs "liblua-\${v##*/}.a" *.o && rm -f *.o
  cc -O1 -I"\$v" -o "lua-\${v##*/}" "$WORK/driver.c" "liblua-\${v##*/}.a" -lm -ldl
  "./lua-\${v##*/}"
done
ls libz-sys-*/src/zlib/*.c | xargs -P2 -n4 cc -O1 -c && ar rcs libz.a *.o && rm -f *.o
echo \$(( \$(date +%s%N) - t0 )) >"\$1"
EOF
cat >"$WORK/stream.sh" <<'EOF'
set -e
t0=$(date +%s%N)
for f in big-1.bin big-2.bin; do dd if="$f" of=/dev/null bs=1M status=none; done
echo $(( $(date +%s%N) - t0 )) >"$1"
EOF

drop_stream_cache() { for f in "$WORK"/stream/big-*.bin; do dd if="$f" iflag=nocache count=0 status=none; done; }
warm_stream_cache() { cat "$WORK"/stream/big-*.bin >/dev/null; }

# run WORKLOAD VARIANT: one timed run; prints its seconds.
run() {
  local workload=$1 variant=$2 dir script
  case $workload in
    metadata) dir=$WORK/metadata script=$WORK/metadata.sh ;;
    stream-warm) dir=$WORK/stream script=$WORK/stream.sh; warm_stream_cache ;;
    stream-cold) dir=$WORK/stream script=$WORK/stream.sh; drop_stream_cache ;;
  esac
  if [ "$variant" = traced ]; then
    "$ULNET" fsstudy trace --mount "$dir" --output "$WORK/$workload.fstrace" -- sh "$script" "$WORK/elapsed" 2>>"$WORK/trace.log"
  else
    (cd "$dir" && sh "$script" "$WORK/elapsed")
  fi
  awk '{ printf "%.3f\n", $1 / 1e9 }' "$WORK/elapsed"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A times
workloads=(metadata stream-warm stream-cold)
for round in $(seq "$ROUNDS"); do
  for w in "${workloads[@]}"; do
    if [ $((round % 2)) = 1 ]; then order=(untraced traced); else order=(traced untraced); fi
    for v in "${order[@]}"; do
      t=$(run "$w" "$v")
      times[$w,$v]+="$t "
      echo "round $round $w $v ${t} s" >&2
    done
  done
done

mkdir -p "$(dirname "$OUT")"
{
  echo "# ulnet fsstudy trace overhead: traced vs untraced, $ROUNDS alternating rounds, medians"
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -r), $(nproc) CPUs, commit $(git rev-parse --short HEAD)"
  printf '%-12s %12s %12s %8s   %s\n' workload untraced_s traced_s ratio "rounds (untraced | traced)"
  for w in "${workloads[@]}"; do
    u=$(tr ' ' '\n' <<<"${times[$w,untraced]}" | grep . | median)
    t=$(tr ' ' '\n' <<<"${times[$w,traced]}" | grep . | median)
    printf '%-12s %12.3f %12.3f %8.2f   %s| %s\n' "$w" "$u" "$t" "$(awk -v a="$t" -v b="$u" 'BEGIN { print a / b }')" \
      "${times[$w,untraced]}" "${times[$w,traced]}"
  done
  for w in "${workloads[@]}"; do
    echo "# $w trace: $("$ULNET" fsstudy report "$WORK/$w.fstrace" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["inputs"]["operations"], "operations,", d["inputs"]["dropped"], "dropped,", d["opens"], "opens,", d["bytes_read"], "bytes read,", d["bytes_written"], "bytes written")')"
  done
} | tee "$OUT"
