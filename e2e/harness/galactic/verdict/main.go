// Command vpc-attach-slice-verdict runs galactic's ingress sidecar selection and route
// building (internal/ingresssidecar: IsSelected, BuildDesiredRoute) on EndpointSlices.
//
// It is copied into galactic's source tree by e2e/harness/galactic/build.py (Go lets only
// code inside that module import its internal packages). Input on stdin: a JSON list of
// discovery.k8s.io/v1 EndpointSlices as the API server returns them. Output: a JSON list
// with one verdict per slice, in input order.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	discoveryv1 "k8s.io/api/discovery/v1"

	"go.datum.net/galactic/internal/ingresssidecar"
)

// route is the sidecar's DesiredRoute as the harness reads it.
type route struct {
	VPC    string `json:"vpc"`
	Prefix string `json:"prefix"`
	SID    string `json:"sid"`
}

// verdict says what the sidecar would do with one slice: skip it (not selected), drop it as
// malformed (error), install a route, or nothing (selected, no SID yet).
type verdict struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Selected  bool   `json:"selected"`
	Route     *route `json:"route"`
	Error     string `json:"error"`
}

func judge(slice *discoveryv1.EndpointSlice) verdict {
	out := verdict{Namespace: slice.Namespace, Name: slice.Name,
		Selected: ingresssidecar.IsSelected(slice)}
	desired, err := ingresssidecar.BuildDesiredRoute(slice)
	if err != nil {
		out.Error = err.Error()
	} else if desired != nil {
		out.Route = &route{VPC: desired.VPC, Prefix: desired.Prefix.String(),
			SID: desired.SID.String()}
	}
	return out
}

func main() {
	var slices []discoveryv1.EndpointSlice
	if err := json.NewDecoder(os.Stdin).Decode(&slices); err != nil {
		fmt.Fprintf(os.Stderr, "vpc-attach-slice-verdict: decode EndpointSlices from stdin: %v\n", err)
		os.Exit(2)
	}
	verdicts := make([]verdict, 0, len(slices))
	for i := range slices {
		verdicts = append(verdicts, judge(&slices[i]))
	}
	if err := json.NewEncoder(os.Stdout).Encode(verdicts); err != nil {
		fmt.Fprintf(os.Stderr, "vpc-attach-slice-verdict: write verdicts: %v\n", err)
		os.Exit(2)
	}
}
