#!/usr/bin/env bash
# Coverage-guided fuzzing of ulnet's decoders and protocol machines (libFuzzer).
#
# usage: fuzz/run.sh [--stable] [SECONDS] [TARGET ...]
#   SECONDS  per target (default 60); TARGET defaults to every one (fuzz/fuzz_targets).
#   default  cargo-fuzz on the nightly toolchain, with AddressSanitizer.
#   --stable the stable toolchain, no sanitizer: the same coverage instrumentation and
#            comparison tracing (rustc's -Cpasses=sancov-module) and the same libFuzzer, so
#            CI, which has no nightly, runs every target too (`.ci/run`).
# Corpora grow in fuzz/corpus/TARGET (not committed), starting from fuzz/seeds/TARGET where
# there is one; a failing input is saved in fuzz/artifacts/TARGET and the script exits
# non-zero after the remaining targets ran.
# Optimised, with debug assertions and overflow checks on (-O -a): arithmetic that a
# forged input can overflow fails here as it would in a debug build, not wrap silently.
set -euo pipefail
cd "$(dirname "$0")"
stable=false
if [ "${1:-}" = --stable ]; then
  stable=true
  shift
fi
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls fuzz_targets | sed -n 's/\.rs$//p')
if $stable; then
  host=$(rustc -vV | sed -n 's/^host: //p')
  # --target keeps these flags off build scripts, as cargo-fuzz does.
  RUSTFLAGS="--cfg fuzzing -Cdebug-assertions -Coverflow-checks -Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares" \
    CARGO_TARGET_DIR=target/stable cargo build --release --locked --target "$host" --bins
else
  if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz/run.sh needs the nightly toolchain (rustup toolchain install nightly), or --stable" >&2
    exit 2
  fi
  command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
  cargo +nightly fuzz build -O -a
fi
failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  echo "== $t (${seconds} s)"
  dirs=("corpus/$t"); [ -d "seeds/$t" ] && dirs+=("seeds/$t")
  flags=(-max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1)
  if $stable; then
    fuzz=("target/stable/$host/release/$t" "${dirs[@]}" -artifact_prefix="artifacts/$t/" "${flags[@]}")
  else
    fuzz=(cargo +nightly fuzz run -O -a "$t" "${dirs[@]}" -- "${flags[@]}")
  fi
  if ! "${fuzz[@]}" 2>"corpus/$t.log"; then
    failed+=("$t")
    grep -E "panicked|ERROR|SUMMARY|Test unit written" "corpus/$t.log" | head -8
  fi
  grep -E "stat::number_of_executed_units|stat::new_units_added|cov: " "corpus/$t.log" | tail -3
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
echo "no failures in ${#targets[@]} targets"
