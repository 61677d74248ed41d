#!/usr/bin/env bash
# Coverage-guided fuzzing of ulnet's decoders and protocol machines (libFuzzer through
# cargo-fuzz, on the nightly toolchain).
#
# usage: fuzz/run.sh [SECONDS] [TARGET ...]
#   SECONDS  per target (default 60); TARGET defaults to every one (`cargo fuzz list`).
# Corpora grow in fuzz/corpus/TARGET (not committed); a failing input is saved in
# fuzz/artifacts/TARGET and the script exits non-zero after the remaining targets ran.
# Optimised, with debug assertions and overflow checks on (-O -a): arithmetic that a
# forged input can overflow fails here as it would in a debug build, not wrap silently.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
shift || true
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz/run.sh needs the nightly toolchain: rustup toolchain install nightly" >&2
  exit 2
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build -O -a
failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "== $t (${seconds} s)"
  seeds=(); [ -d "seeds/$t" ] && seeds=("seeds/$t")
  if ! cargo +nightly fuzz run -O -a "$t" "corpus/$t" "${seeds[@]}" -- -max_total_time="$seconds" -max_len=65536 \
      -rss_limit_mb=2048 -print_final_stats=1 2>"corpus/$t.log"; then
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
