#!/usr/bin/env bash
# `snakemake --profile slurm` looks for a folder named slurm in ./, ~/.config/snakemake/ and
# /etc/xdg/snakemake/, not in profiles/; link this checkout's profiles/slurm into the user's
# config folder. An existing profile of that name that is not ours is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${XDG_CONFIG_HOME:-$HOME/.config}/snakemake/slurm"
if [ ! -e "$target" ] && [ ! -L "$target" ]; then
  mkdir -p "$(dirname "$target")"
  ln -s "$PWD/profiles/slurm" "$target"
  echo "linked $target -> $PWD/profiles/slurm"
elif [ "$(readlink -f "$target")" != "$(readlink -f profiles/slurm)" ]; then
  echo "note: $target exists and is not this checkout's profile; left as it is" \
       "(use --workflow-profile profiles/slurm instead)" >&2
fi
