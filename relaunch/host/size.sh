#!/usr/bin/env bash
# shellcheck shell=bash
# Bytes under a folder.
du -sb -- "$1" 2>/dev/null | cut -f1