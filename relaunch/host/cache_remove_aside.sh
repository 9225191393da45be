#!/usr/bin/env bash
# shellcheck shell=bash
# Remove an aside copy judged to be only cache; it must still be the sibling relaunch made.
cache=$1 aside=$2
case $aside in "$cache".relaunch-cleared-*) ;; *) echo "refusing to remove $aside"; exit 3 ;; esac
[ -L "$aside" ] && { echo "refusing to remove a link"; exit 3; }
rm -rf -- "$aside"
