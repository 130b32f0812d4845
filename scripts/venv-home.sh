# Sourced by the set-up scripts. `venv_home NAME KEY [PYTHON]` prints where the venv NAME
# (.venv, .venv-lab, …) lives and makes ./NAME a link to it. The venvs live in a machine-wide
# cache, ${RIVET_CACHE_DIR:-/var/cache/rivet}/venvs, under a name made of what goes into them
# (KEY: the pinned packages) and the Python they are made from: a fresh clone on a machine that
# already has them links them in a second instead of installing the same packages again
# (minutes a clone), and a checkout pinning other versions gets venvs of its own. What is
# installed, and the checks that it is, stay the calling script's.
venv_home() {
  local name=$1 key=$2 py
  py=$(command -v "${3:-python3}")
  local dir
  dir="${RIVET_CACHE_DIR:-/var/cache/rivet}/venvs/${name#.}-$(printf '%s %s' "$key" "$py" | sha256sum | cut -c1-12)"
  mkdir -p "$(dirname "$dir")"
  if [ "$(readlink "$name" 2>/dev/null || true)" != "$dir" ]; then
    rm -rf "$name"
    ln -s "$dir" "$name"
  fi
  echo "$dir"
}
