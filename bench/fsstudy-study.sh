#!/usr/bin/env bash
# The study of docs/fs-study.md: real workloads that nobody in this project wrote, each
# traced with `ulnet fsstudy trace -- COMMAND`, a snapshot of /usr, and the reports (one
# per workload and one of everything) written into docs/fs-study/.
#
# usage: bench/fsstudy-study.sh        (WORK=/tmp/fsstudy-study by default; root, /dev/fuse)
# Workloads:
#   build   untar lua-src and libz-sys as crates.io ships them and build Lua 5.1-5.4 and
#           zlib with gcc -O2 (two compilers at a time), link a program against each Lua
#           library and run it
#   git     clone a local repository (this project's own, 600+ commits; git copies its
#           objects, --no-local) and walk its history: git log -p, git log --stat, git
#           status, git grep
#   pytest  unpack the sdist of more-itertools (PyPI) and run its test suite with pytest
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/fsstudy-study}
ULNET=${ULNET:-$PWD/target/release/ulnet}
DOCS=${DOCS:-docs/fs-study}
REPO=${REPO:-$(git rev-parse --show-toplevel)}
[ -x "$ULNET" ] || cargo build --release --locked -p ulnet
[ "$(id -u)" = 0 ] && [ -e /dev/fuse ] || { echo "needs root and /dev/fuse" >&2; exit 2; }

crate() { ls "$HOME"/.cargo/registry/cache/*/"$1"-*.crate 2>/dev/null | sort -V | tail -1; }
rm -rf "$WORK" && mkdir -p "$WORK"/{build,git,pytest,sdist}
if [ -z "$(crate lua-src)" ] || [ -z "$(crate libz-sys)" ]; then
  mkdir "$WORK/fetch" "$WORK/fetch/src" && echo 'fn main() {}' >"$WORK/fetch/src/main.rs"
  printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nlua-src = "547"\nlibz-sys = "1"\n[workspace]\n' >"$WORK/fetch/Cargo.toml"
  (cd "$WORK/fetch" && cargo fetch -q)
fi
pip download --quiet more-itertools==11.2.1 --no-binary :all: --no-deps -d "$WORK/sdist"
python3 -m pytest --version >/dev/null 2>&1 || pip install --quiet pytest

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
cat >"$WORK/build.sh" <<EOF
set -e
tar xzf "$(crate lua-src)" && tar xzf "$(crate libz-sys)"
for v in lua-src-*/lua-5.*; do
  ls "\$v"/*.c | xargs -P2 -n8 cc -O2 -DLUA_USE_POSIX -c
  ar rcs "liblua-\${v##*/}.a" *.o && rm -f *.o
  cc -O2 -I"\$v" -o "lua-\${v##*/}" "$WORK/driver.c" "liblua-\${v##*/}.a" -lm -ldl
  "./lua-\${v##*/}"
done
ls libz-sys-*/src/zlib/*.c | xargs -P2 -n4 cc -O2 -DHAVE_UNISTD_H -c && ar rcs libz.a *.o && rm -f *.o
EOF
cat >"$WORK/git.sh" <<EOF
set -e
git clone --quiet --no-local "$REPO" repo
cd repo
git log -p >/dev/null
git log --stat >/dev/null
git status --short >/dev/null
git grep -c fn >/dev/null
EOF
cat >"$WORK/pytest.sh" <<EOF
set -e
tar xzf "$WORK"/sdist/more_itertools-*.tar.gz
cd more_itertools-*
python3 -m pytest -q tests
EOF

for w in build git pytest; do
  echo "== $w" >&2
  "$ULNET" fsstudy trace --mount "$WORK/$w" --output "$WORK/$w.fstrace" --json -- sh "$WORK/$w.sh" >"$WORK/$w.summary.json"
done
echo "== snapshot of /usr" >&2
"$ULNET" fsstudy snapshot /usr --output "$WORK/usr.fssnap" --json >"$WORK/usr.summary.json"

rm -rf "$DOCS" && mkdir -p "$DOCS"
for w in build git pytest; do
  "$ULNET" fsstudy report "$WORK/$w.fstrace" --out "$DOCS/$w" --json >"$WORK/$w.study.json"
done
"$ULNET" fsstudy report "$WORK/build.fstrace" "$WORK/git.fstrace" "$WORK/pytest.fstrace" "$WORK/usr.fssnap" --out "$DOCS/all" >"$WORK/all.txt"
# The figures and Markdown are the record; the full JSON stays in $WORK.
rm -f "$DOCS"/*/study.json
cat "$WORK/all.txt"
