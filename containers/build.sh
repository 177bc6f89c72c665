#!/usr/bin/env bash
# Build the hetrl Apptainer image from containers/hetrl.def (on a machine with apptainer and
# internet access to nvcr.io; a login node with `apptainer build --fakeroot` works).
#
#   containers/build.sh [OUT.sif] [--build-arg NGC_TAG=26.11-py3 --build-arg VLLM_VERSION=...]
#
# The build context is the repository root (the .def copies pyproject.toml, src/, recipes/, slurm/).
set -euo pipefail
cd "$(dirname "$0")/.."
out=containers/hetrl.sif
if [[ $# -gt 0 && $1 != --* ]]; then out=$1; shift; fi
command -v apptainer >/dev/null || { echo "build.sh: apptainer not found (https://apptainer.org/docs/admin/main/installation.html)" >&2; exit 1; }
fakeroot=()
[[ $(id -u) == 0 ]] || fakeroot=(--fakeroot)
apptainer build "${fakeroot[@]}" "$@" "$out" containers/hetrl.def
apptainer test "$out"
echo "built $out: use it with  python launch.py ... cluster.container=$(realpath "$out")"
