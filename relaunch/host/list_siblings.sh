#!/usr/bin/env bash
# shellcheck shell=bash
# The venv's siblings, NUL-separated.
find "$(dirname -- "$1")" -mindepth 1 -maxdepth 1 -printf '%f\0'