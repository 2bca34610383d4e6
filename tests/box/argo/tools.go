//go:build tools

// Package tools pins the Argo commands the box builds from the module proxy: the real
// workflow-controller, argoexec and argo CLI, built by `go build <pkg>` from this module.
package tools

import (
	_ "github.com/argoproj/argo-workflows/v4/cmd/argo"
	_ "github.com/argoproj/argo-workflows/v4/cmd/argoexec"
	_ "github.com/argoproj/argo-workflows/v4/cmd/workflow-controller"
)
