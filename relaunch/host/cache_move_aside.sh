#!/usr/bin/env bash
# shellcheck shell=bash
# Move the inductor cache aside and put a fresh, marked folder in its place.
cache=$1 stamp=$2 warming=$3 mine=$4
aside=
if [ -e "$cache" ] || [ -L "$cache" ]; then
  aside="$cache.relaunch-cleared-$stamp"
  bytes=$(du -sb -- "$cache" 2>/dev/null | cut -f1)
  mv -T -- "$cache" "$aside" || { echo "cannot move $cache aside"; exit 3; }
fi
mkdir -p -- "$cache" && touch -- "$cache/$warming" "$cache/$mine" || exit 4
[ -n "$aside" ] || exit 0
printf 'aside %s\0bytes %s\0kind %s\0' "$aside" "${bytes:-0}" "$(find "$aside" -maxdepth 0 -printf '%y')"
[ -L "$aside" ] || find "$aside" -mindepth 1 -maxdepth 1 -printf 'entry %f\0'
