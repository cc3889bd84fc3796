//go:build tools

// Package tools pins the helm command's module for build.sh.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
