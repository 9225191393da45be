#!/usr/bin/env bash
# shellcheck shell=bash
# shellcheck source=lib.sh
. ./lib.sh
# List checkpoint_dir NUL-separated for relaunch/plans/checkpoint_listing.py to read; relaunch/deciding/checkpoints.py
# makes the choice. $1 checkpoint_dir, $2 the file of checkpoints recorded as failing to load, $3 one to record now
# (or ""), $4 the state folder.
# Records (a name may hold anything but NUL and `/`):
#   KIND MTIME E|N NAME  each entry (find's %y, its own mtime, Empty or Not)
#   W NEWEST NAME        a folder's newest write: the newest mtime of anything in it, a few levels down
#   L NAME/TARGET        where a symbolic link points (a `latest` link names the newest complete checkpoint)
#   C NAME/TEXT          the first line of a framework tracker (Megatron, DeepSpeed `latest`)
#   S MTIME NAME         a checkpoint recorded as failing to load
#   R KEY VALUE          the current run's records: when it started and from which checkpoint (an adopted run: its
#                        command line), when a stop signalled it, how it died
#   P SIZE HEAD TAIL NAME[/PATH]  bytes of one of the newest entries, or of a file PATH inside one (HEAD and TAIL
#                        base64, `-` for none): only gathered here, judged in Python (relaunch/deciding/checkpoint_formats.py)
#   T NAME               a probed folder holds more files than were listed
# checkpoint_dir may be a symbolic link: it is followed (find -H), never listed as one empty link.
dir=$1 skipfile=$2 refuse=$3 state=$4
# Deep enough for Megatron's iter_N/mp_rank_00/model_optim_rng.pt and DeepSpeed's sharded folders; bounded, so a
# folder of a million files is never walked whole.
DEPTH=4
# Bounded reading: the newest PROBE entries (by their newest write) are probed; in a folder, FOLDER_FILES files
# are listed with their sizes and FOLDER_READS of them (JSON first) have their bytes read.
PROBE=8 FOLDER_FILES=256 FOLDER_READS=24
# A safetensors header or a JSON file is read whole up to HEAD_MAX bytes, a .npy file's first NPY_HEAD bytes (its
# header); otherwise the first 64 bytes.
HEAD_MAX=4194304 NPY_HEAD=4096
# A zip's end: its end-of-central-directory record (22 bytes and a comment of up to 65535), and zip64's locator
# (20) and record (56) before it. Files inside a folder get a shorter tail: torch.save writes no zip comment.
TAIL=65633 TAIL_IN_FOLDER=4096
# Recorded with its mtime: a trainer that later saves a good checkpoint under the same name is not skipped.
if [ -n "$refuse" ] && [ -e "$dir/$refuse" ]; then
  mkdir -p -- "$(dirname -- "$skipfile")" && printf '%s %s\0' "$(stat -c %Y -- "$dir/$refuse")" "$refuse" >> "$skipfile" || exit 3
fi
[ -d "$dir" ] || { echo "missing"; exit 0; }
echo "present"
find -H "$dir" -mindepth 1 -maxdepth 1 \( -empty -printf '%y %T@ E %f\0' -o -printf '%y %T@ N %f\0' \)
# A file being written inside a folder does not change the folder's own mtime: its newest write is inside.
while IFS= read -r -d '' sub; do
  newest=$(find "$sub" -maxdepth "$DEPTH" -printf '%T@\n' 2> /dev/null | sort -n | tail -n 1)
  [ -n "$newest" ] && printf 'W %s %s\0' "$newest" "${sub##*/}"
done < <(find -H "$dir" -mindepth 1 -maxdepth 1 -type d -print0)
while IFS= read -r -d '' link; do
  printf 'L %s/%s\0' "${link##*/}" "$(readlink -- "$link")"
done < <(find -H "$dir" -mindepth 1 -maxdepth 1 -type l -print0)
# Megatron's tracker holds an iteration number (or `release`), DeepSpeed's `latest` file the tag of its folder.
for name in latest_checkpointed_iteration.txt latest; do
  if [ -f "$dir/$name" ] && [ ! -L "$dir/$name" ]; then
    line=$(head -c 256 -- "$dir/$name" 2> /dev/null | tr -d '\0' | head -n 1)
    printf 'C %s/%s\0' "$name" "$line"
  fi
done

# One P record for FILE, labelled LABEL, reading at most TAILSIZE bytes from its end.
probe() {
  local f=$1 label=$2 tailsize=$3 size head='' tail='' n=0 i=0 b len=64
  size=$(stat -L -c %s -- "$f" 2> /dev/null) || return 0
  case $f in
    *.json) [ "$size" -le "$HEAD_MAX" ] && head=$(base64 -w 0 < "$f" 2> /dev/null) ;;
    *.distcp | */.metadata) ;;
    *)
      # A safetensors file starts with its header's length, 8 bytes little-endian (od prints them in file order).
      for b in $(od -An -tu1 -N8 -- "$f" 2> /dev/null); do n=$((n | (b << (8 * i)))) i=$((i + 1)); done
      [[ $f == *.safetensors ]] && [ "$i" -eq 8 ] && [ "$n" -ge 0 ] && [ "$n" -le "$HEAD_MAX" ] && len=$((8 + n))
      # A .npy header (its dtype and shape) is a few hundred bytes at most in practice.
      [[ $f == *.npy ]] && len=$NPY_HEAD
      head=$(head -c "$len" -- "$f" 2> /dev/null | base64 -w 0)
      tail=$(tail -c "$tailsize" -- "$f" 2> /dev/null | base64 -w 0)
      ;;
  esac
  printf 'P %s %s %s %s\0' "$size" "${head:--}" "${tail:--}" "$label"
}
# The newest entries by their newest write (a folder's, a few levels down), hidden names and trackers aside.
while IFS= read -r -d '' line; do
  name=${line#* }
  path=$dir/$name
  if [ -d "$path" ]; then
    files=() json=() rest=()
    while IFS= read -r -d '' rel; do files+=("$rel"); done < <(find -H "$path" -maxdepth "$DEPTH" -type f -printf '%P\0' 2> /dev/null | sort -z | head -z -n "$((FOLDER_FILES + 1))")
    if [ "${#files[@]}" -gt "$FOLDER_FILES" ]; then
      printf 'T %s\0' "$name"
      files=("${files[@]:0:FOLDER_FILES}")
    fi
    # JSON first (trainer_state.json, *.index.json), then the files of known formats by name; sizes of the rest.
    for rel in "${files[@]}"; do
      case ${rel##*/} in
        *.json) json+=("$rel") ;;
        *.safetensors | *.pt | *.pth | *.bin | *.ckpt | *.pkl | *.pickle | *.npy | *.tar | *.zip) rest+=("$rel") ;;
        *) printf 'P %s - - %s/%s\0' "$(stat -L -c %s -- "$path/$rel" 2> /dev/null || echo 0)" "$name" "$rel" ;;
      esac
    done
    reads=0
    for rel in "${json[@]}" "${rest[@]}"; do
      reads=$((reads + 1))
      if [ "$reads" -le "$FOLDER_READS" ]; then
        probe "$path/$rel" "$name/$rel" "$TAIL_IN_FOLDER"
      else
        printf 'P %s - - %s/%s\0' "$(stat -L -c %s -- "$path/$rel" 2> /dev/null || echo 0)" "$name" "$rel"
      fi
    done
  elif [ -f "$path" ]; then
    probe "$path" "$name" "$TAIL"
  fi
done < <(
  while IFS= read -r -d '' entry; do
    what=${entry#* }
    case $what in .* | latest | latest_checkpointed_iteration.txt) continue ;; esac
    when=${entry%% *}
    [ -d "$dir/$what" ] && when=$(find -H "$dir/$what" -maxdepth "$DEPTH" -printf '%T@\n' 2> /dev/null | sort -n | tail -n 1)
    printf '%s %s\0' "${when:-0}" "$what"
  done < <(find -H "$dir" -mindepth 1 -maxdepth 1 -printf '%T@ %f\0') | sort -z -rn | head -z -n "$PROBE"
)

if [ -f "$skipfile" ]; then while IFS= read -r -d '' name; do printf 'S %s\0' "$name"; done < "$skipfile"; fi
# The current run's records: a checkpoint written while a stop was killing it, or growing when it died, is suspect.
if [ -n "$state" ] && cur=$(current_run "$state"); then
  run=$(run_folder "$state" "$cur")
  printf 'R run %s\0' "$cur"
  for key in started_at stop_term_at stop_killed_at exit_code; do
    slurp value "$run/$key"
    [ -n "$value" ] && printf 'R %s %s\0' "$key" "$value"
  done
  # When the trainer died: the supervisor writes exit_code the moment it exits.
  [ -f "$run/exit_code" ] && printf 'R exit_at %s\0' "$(find "$run/exit_code" -maxdepth 0 -printf '%T@')"
  # What the run resumed from, the start of its own trajectory: the checkpoint launch.sh gave it (empty: from scratch);
  # an adopted run's command line, which may name it.
  if [ -f "$run/adopted" ]; then
    slurp value "$run/command"
    [ -n "$value" ] && printf 'R command %s\0' "${value:0:4096}"
  elif [ -f "$run/checkpoint" ]; then
    slurp value "$run/checkpoint"
    printf 'R resumed_from %s\0' "$value"
  fi
fi
exit 0
