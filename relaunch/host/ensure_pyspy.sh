#!/usr/bin/env bash
# shellcheck shell=bash
# The path of a usable py-spy, installed into STATE/tools once.
tools=$1 python=$2; shift 2
[ -x "$tools/bin/py-spy" ] && { echo "$tools/bin/py-spy"; exit 0; }
command -v py-spy >/dev/null 2>&1 && { command -v py-spy; exit 0; }
command -v uv >/dev/null 2>&1 || { echo "py-spy is not installed and uv is missing to install it"; exit 3; }
out=$(uv venv -q --python "$python" "$tools" 2>&1 && uv pip install -q --python "$tools/bin/python" "$@" py-spy 2>&1) \
  || { echo "cannot install py-spy: $(printf '%s' "$out" | tail -n 3 | tr '\n' ' ')"; exit 3; }
echo "$tools/bin/py-spy"
