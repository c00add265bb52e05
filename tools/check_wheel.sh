#!/usr/bin/env sh
# What a user gets from `pip install .`, checked from outside the checkout (make test's "== wheel" step):
#  1. build the wheel from a copy of this tree (no network: this environment's setuptools, no build isolation);
#  2. install it into fresh virtual environments (no system site-packages, no checkout on its path): one with
#     rxcuda's own requirements, one per set of extras a docs block names (`needs '.[notebook]'`);
#  3. from an empty directory elsewhere: `rxcuda demo --plan`, `python -m rxcuda.examples` (the listing), and every
#     block of the README and docs/ marked "runs without a GPU", each with exactly the extras it names.
# A fresh environment gets rxcuda from the wheel and nothing else from this checkout. Its dependencies (CuPy,
# cuda-python, ... several hundred MB) are the ones this project's .venv already holds, linked entry by entry
# into the new site-packages: exactly those `pip install '.[EXTRAS]'` would install (tools/extra_env.py reads
# pyproject.toml and the installed distributions' requirements). That works offline and takes seconds on a small
# machine, where installing them again would need the network or a wheel cache, and minutes. Links rather than a
# .pth line to .venv: cuda-pathfinder looks for NVIDIA's libraries (libnvrtc) only in the environment's own
# site-packages directories, and a .pth line would bring every other package of .venv too.
#
# usage: tools/check_wheel.sh [PYTHON]    (PYTHON: the project's environment, default .venv/bin/python)
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
python=${1:-.venv/bin/python}
case "$python" in /*) ;; *) python="$root/$python" ;; esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rxcuda-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_wheel: $*" >&2; exit 1; }

# 1. the wheel, from a copy (setuptools writes build/ and *.egg-info into the tree it builds)
"$python" - "$root" "$tmp/src" <<'EOF'
import shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2], ignore=shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "site", "*.so"))
EOF
"$python" -m pip wheel --no-deps --no-build-isolation -q -w "$tmp/dist" "$tmp/src" > "$tmp/build.log" 2>&1 \
    || { cat "$tmp/build.log"; fail "building the wheel failed"; }
wheel=$(ls "$tmp"/dist/rxcuda-*.whl)

# 2. fresh environments with the wheel: one with rxcuda's own requirements only, and one per set of extras a docs
#    block names (needs '.[notebook]'), each holding exactly what pip install '.[EXTRAS]' would bring
#    (tools/extra_env.py: the requirements' closure, found in this project's environment and linked in, see above)
deps=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
make_env() {  # make_env DIR [EXTRA,...]
    "$python" -m venv --without-pip "$1"
    envsite=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$python" "$root/tools/extra_env.py" $(echo "${2:-}" | tr ',' ' ') > "$1.entries" || fail "no environment for '.[${2:-}]'"
    while read -r entry; do
        case "$entry" in rxcuda*|__editable__*|__pycache__) continue ;; esac
        if [ -e "$deps/$entry" ]; then ln -s "$deps/$entry" "$envsite/"; fi
    done < "$1.entries"
    "$python" -m pip --python "$1/bin/python" install --no-deps --no-index -q "$wheel" > "$1.log" 2>&1 \
        || { cat "$1.log"; fail "installing the wheel into $1 failed"; }
}
make_env "$tmp/venv"
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# 3. from an empty directory, with nothing of the checkout on the path
mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere"
run() { env -u PYTHONPATH -u RXCUDA_KERNELS "$@"; }
where=$(run "$tmp/venv/bin/python" -c 'import rxcuda; print(rxcuda.__file__)')
case "$where" in
    "$site"/rxcuda/__init__.py) ;;
    *) fail "rxcuda came from $where, not from the wheel in $site" ;;
esac
# the compiled parameter path: built into the wheel (setup.py), loaded from it, nothing compiled on import
"$python" -c 'import sys, zipfile; sys.exit(not any(n.startswith("rxcuda/cuda/_hotpath.") and n.endswith(".so") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel" \
    || fail "the wheel has no compiled rxcuda/cuda/_hotpath module"
native=$(run "$tmp/venv/bin/python" -c 'from rxcuda.cuda import _native; m = _native.hotpath(); print(m.__file__ if m else "none: " + _native.why_not)')
case "$native" in
    "$site"/rxcuda/cuda/_hotpath.*) ;;
    *) fail "the installed rxcuda did not load its compiled parameter path from $site: $native" ;;
esac
run "$tmp/venv/bin/rxcuda" demo --plan --size 1000 > demo.txt || { cat demo.txt; fail "rxcuda demo --plan failed"; }
grep -q "graph nodes (4, in launch order):" demo.txt || { cat demo.txt; fail "rxcuda demo --plan printed no plan"; }
run "$tmp/venv/bin/python" -m rxcuda.examples > examples.txt || { cat examples.txt; fail "python -m rxcuda.examples failed"; }
grep -q "^  particles " examples.txt || { cat examples.txt; fail "python -m rxcuda.examples lists no particles"; }

# the README's and the site's blocks that need no GPU, cut out with the parser the docs tests use, in one folder
# per set of extras they name ("-": none)
"$python" - "$root" "$tmp/snippets" <<'EOF'
import importlib.util, pathlib, re, sys
root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
spec = importlib.util.spec_from_file_location("_docs", root / "tests" / "unit" / "_docs.py")
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
for s in module.all_snippets():
    if s.no_gpu:
        folder = out / (",".join(sorted(s.extras)) or "-")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / (re.sub(r"[^\w.+-]", "_", s.id) + ".py")).write_text(s.source)
EOF
count=0
export RXCUDA_VIEW_WAIT_MAX=0.1  # the live-view block serves 60 s for a reader, not for this check
for group in "$tmp"/snippets/*; do
    extras=$(basename "$group")
    env="$tmp/venv"
    if [ "$extras" != "-" ]; then
        env="$tmp/venv-$extras"
        make_env "$env" "$extras"
    fi
    for snippet in "$group"/*.py; do
        run "$env/bin/python" "$snippet" > snippet.log 2>&1 \
            || { cat snippet.log; fail "docs block $(basename "$snippet" .py) failed with pip install '.[${extras#-}]'"; }
        count=$((count + 1))
    done
done
[ "$count" -gt 0 ] || fail "the docs have no block marked 'runs without a GPU'"
[ -z "$(ls -A | grep -v -e '^demo.txt$' -e '^examples.txt$' -e '^snippet.log$')" ] \
    || fail "something was left in the directory the checks ran in: $(ls -A)"
echo "wheel $(basename "$wheel"): with its compiled parameter path; installed into fresh environments; from another directory rxcuda demo --plan," \
     "python -m rxcuda.examples and $count docs blocks that need no GPU ran, each with exactly the extras it names"
