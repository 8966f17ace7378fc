// Command vpc-attach-ebpf-sweep runs galactic's eBPF vrf_table sweep once:
// gc.SweepEBPFVRFTable, the function `galactic-cni run` calls on its 5-minute ticker, with a
// controller-runtime client built from a kubeconfig instead of the in-cluster config. With
// --router-gc it runs galactic-router's garbage collection pass instead: gc.RunGC, what the
// router's GC ticker (GALACTIC_ROUTER_GC_INTERVAL) calls.
//
// It is copied into galactic's source tree by e2e/harness/galactic/build.py (Go lets only
// code inside that module import its internal packages). Flags (or env): --kubeconfig
// (KUBECONFIG), --namespace (GALACTIC_SWEEP_NAMESPACE, default galactic-system), --node-name
// (GALACTIC_SWEEP_NODE_NAME), --pin-dir (default galactic's /sys/fs/bpf/galactic). Output: the
// CleanupResult as one JSON object on stdout; galactic's own log lines go to stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"go.datum.net/galactic/internal/gc"
	"go.datum.net/galactic/internal/plumbing/ebpf/attach"
	bgpv1alpha1 "go.datum.net/network/api/v1alpha1"
)

const sweepTimeout = 60 * time.Second

// newClient builds the client the way internal/installer does (the same scheme: client-go's
// kinds and galactic's BGP kinds), from a kubeconfig file.
func newClient(kubeconfig string) (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register client-go kinds: %w", err)
	}
	if err := bgpv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register BGP kinds: %w", err)
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %q: %w", kubeconfig, err)
	}
	return client.New(config, client.Options{Scheme: scheme})
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "vpc-attach-ebpf-sweep: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	namespace := flag.String("namespace", envOr("GALACTIC_SWEEP_NAMESPACE", "galactic-system"),
		"namespace of the BGPRouters and BGPVRFInstances")
	nodeName := flag.String("node-name", os.Getenv("GALACTIC_SWEEP_NODE_NAME"), "this node's name")
	pinDir := flag.String("pin-dir", attach.PinDir, "galactic's bpffs pin directory")
	routerGC := flag.Bool("router-gc", false, "run galactic-router's GC pass (gc.RunGC) instead")
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" {
		fail("--kubeconfig and --node-name are required")
	}
	// SweepEBPFVRFTable treats a missing pin directory as nothing to do; here that would hide
	// a harness that pointed it at the wrong place, so it is an error.
	if _, err := os.Stat(*pinDir); err != nil && !*routerGC {
		fail("pin directory: %v", err)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	k8s, err := newClient(*kubeconfig)
	if err != nil {
		fail("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
	defer cancel()
	var result gc.CleanupResult
	if *routerGC {
		result = gc.RunGC(ctx, k8s, *namespace, *nodeName)
	} else {
		result = gc.SweepEBPFVRFTable(ctx, k8s, *namespace, *nodeName, *pinDir)
	}
	if err := json.NewEncoder(os.Stdout).Encode(result); err != nil {
		fail("write result: %v", err)
	}
}
