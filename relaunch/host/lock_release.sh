#!/usr/bin/env bash
# shellcheck shell=bash
# Release the lock if we still own it.
lock=$1 owner=$2
[ "$(cat "$lock/owner" 2>/dev/null)" = "$owner" ] && rm -rf -- "$lock"
true
