#!/usr/bin/env bash
# The image's entrypoint.
#   docker run IMAGE [--flag=value ...]   start_training.sh with the flags: a training run with
#                                         DATA_DIR set, else the built-in demo
#   docker run IMAGE COMMAND [ARG ...]    COMMAND in the image, e.g. python -m mlperf_bert score
#                                         /output/package, or bash
# start_training.sh is exec'd, so `docker stop` (SIGTERM to process 1) reaches its handler.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if (( $# == 0 )) || [[ "$1" == -* ]]; then
  exec "$HERE/start_training.sh" "$@"
fi
if ! command -v "$1" >/dev/null 2>&1; then
  echo "error: '$1' is neither a flag nor a command in this image: pass trainer flags as --name=value" \
       "(docker run IMAGE --preset=NAME ...), or a command (docker run IMAGE python -m mlperf_bert --help)" >&2
  exit 2
fi
exec "$@"
